"""How a view reaches a tenant: through `access_tenant`, which answers 404 for a tenant the caller is not in
(never 403, which would reveal that it exists) and 403 when the caller is in it without the needed role."""

from dataclasses import dataclass

from django.http import Http404
from rest_framework.exceptions import PermissionDenied

from tenants.api.authentication import KeyPrincipal
from tenants.models import Role, Tenant
from tenants.selectors import OPERATOR, tenant_role


@dataclass(frozen=True, slots=True)
class TenantAccess:
    tenant: Tenant
    role: str  # "operator", "admin" or "member"

    @property
    def is_operator(self) -> bool:
        return self.role == OPERATOR

    @property
    def can_manage(self) -> bool:
        return self.role in (OPERATOR, Role.ADMIN)


def access_tenant(request, slug: str, *, need: str = Role.MEMBER) -> TenantAccess:
    """The tenant `slug` as the caller may see it; `need` is "member", "admin" or "operator"."""
    tenant = Tenant.objects.filter(slug=slug).first()
    role = _role(request.user, tenant) if tenant is not None else None
    if role is None:
        raise Http404("No such tenant.")
    access = TenantAccess(tenant=tenant, role=role)
    if need == OPERATOR and not access.is_operator:
        raise PermissionDenied("Only operators may do this.")
    if need == Role.ADMIN and not access.can_manage:
        raise PermissionDenied("Only the tenant's admins may do this.")
    return access


def _role(user, tenant: Tenant) -> str | None:
    if isinstance(user, KeyPrincipal):
        return Role.ADMIN if user.tenant_id == tenant.id else None
    return tenant_role(tenant=tenant, user=user)


def require_operator(request) -> None:
    if isinstance(request.user, KeyPrincipal) or not request.user.is_staff:
        raise PermissionDenied("Only operators may do this.")
