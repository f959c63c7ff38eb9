"""`Authorization: Bearer <key>` for the management API: only keys with the `manage` scope, acting as an admin of
their own tenant and nothing else."""

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from tenants.identity import AuthFailure
from tenants.models import Scope, TenantAPIKey
from tenants.selectors import api_key_authenticate
from tenants.services import api_key_mark_used


@dataclass(frozen=True)
class KeyPrincipal:
    """request.user for a key: authenticated, never staff, bound to one tenant."""

    key: TenantAPIKey
    is_authenticated: bool = True
    is_anonymous: bool = False
    is_staff: bool = False
    is_superuser: bool = False
    pk: None = None

    @property
    def tenant_id(self) -> int:
        return self.key.tenant_id

    def __str__(self) -> str:
        return f"key {self.key.prefix}"


class ManageKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        keyword, _, raw_key = header.partition(" ")
        if keyword.lower() != self.keyword.lower():
            return None  # not ours: the session may still authenticate
        result = api_key_authenticate(raw_key.strip(), scope=Scope.MANAGE)
        if isinstance(result, AuthFailure):
            error = exceptions.PermissionDenied if result.status == 403 else exceptions.AuthenticationFailed
            raise error(result.message)
        if result.last_used_at is None or _minutes_since(result.last_used_at) >= 1:
            api_key_mark_used(prefix=result.prefix)
        return KeyPrincipal(result), result

    def authenticate_header(self, request) -> str:
        return self.keyword


def _minutes_since(moment) -> float:
    from django.utils import timezone

    return (timezone.now() - moment).total_seconds() / 60


class ManageKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.api.authentication.ManageKeyAuthentication"
    name = "manageKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An API key with the `manage` scope."}
