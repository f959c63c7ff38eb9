"""What every adapter view shares: tenant-scoped lookups that 404 across tenants, service errors as API errors,
and the roles: members read, admins (and `manage` keys, and operators) write."""

from django.http import Http404
from drf_spectacular.authentication import SessionScheme
from drf_spectacular.utils import extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import APIException

from adapters import selectors
from adapters.api.serializers import ErrorResponseSerializer
from adapters.errors import AdapterServiceError
from adapters.models import Adapter
from tenants.access import TenantAccess, access_tenant
from tenants.api.authentication import KeyPrincipal, ManageKeyAuthentication
from tenants.models import Role

READ_ROLE = Role.MEMBER
WRITE_ROLE = Role.ADMIN


class _ServiceAPIError(APIException):
    def __init__(self, exc: AdapterServiceError):
        self.status_code = exc.status
        self.wait = getattr(exc, "retry_after_s", None)  # DRF answers it as Retry-After
        super().__init__(detail=exc.message, code=exc.code)


class ServiceErrorsMixin:
    """Service refusals (quota, size, state, store) answer with their own status in the standard error shape."""

    def handle_exception(self, exc):
        if isinstance(exc, AdapterServiceError):
            exc = _ServiceAPIError(exc)
        return super().handle_exception(exc)


TAGGED = extend_schema(tags=["adapters"])


def error_responses(*statuses: int) -> dict:
    """Error responses to document beside the automatic ones; 403 (role too low) for every write."""
    from drf_standardized_errors.openapi_serializers import ErrorResponse403Serializer

    return {status: ErrorResponse403Serializer if status == 403 else ErrorResponseSerializer
            for status in (403, *statuses)}


def adapter_access(request, slug: str, name: str, *, need: str = READ_ROLE) -> tuple[TenantAccess, Adapter]:
    access = access_tenant(request, slug, need=need)
    try:
        return access, selectors.adapter_get(tenant=access.tenant, name=name)
    except Adapter.DoesNotExist:
        raise Http404("No such adapter.") from None


def acting_user(request):
    """The person behind the request, or None for an API key."""
    return None if isinstance(request.user, KeyPrincipal) else request.user


class _BodylessRequest:
    """The request as the CSRF check sees it: everything but a parsed body (POST is empty)."""

    def __init__(self, request):
        object.__setattr__(self, "_request", request)

    def __getattr__(self, name):
        if name == "POST":
            from django.http import QueryDict

            return QueryDict()
        return getattr(self._request, name)

    def __setattr__(self, name, value):
        setattr(self._request, name, value)


class HeaderCSRFSessionAuthentication(SessionAuthentication):
    """Session auth whose CSRF token must come in the X-CSRFToken header: the check never parses the body, so
    a streamed upload stays unread until its size and quota have been checked."""

    def enforce_csrf(self, request):
        return super().enforce_csrf(_BodylessRequest(request))


STREAMED_UPLOAD_AUTHENTICATION = [ManageKeyAuthentication, HeaderCSRFSessionAuthentication]


class HeaderCSRFSessionScheme(SessionScheme):
    target_class = "adapters.api.common.HeaderCSRFSessionAuthentication"
    name = "cookieAuthWithCSRFHeader"
