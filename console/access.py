"""How a page reaches a tenant: 404 for anyone outside it (never 403, which would reveal that it exists), 403 for
a teammate asking to change what only admins change. Operators (staff) reach every tenant."""

from dataclasses import dataclass
from functools import wraps
from inspect import iscoroutinefunction

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404

from tenants import selectors
from tenants.models import Role, Tenant


@dataclass(frozen=True, slots=True)
class TenantAccess:
    tenant: Tenant
    role: str  # selectors.OPERATOR, Role.ADMIN or Role.MEMBER

    @property
    def is_operator(self) -> bool:
        return self.role == selectors.OPERATOR

    @property
    def can_manage(self) -> bool:
        return self.role in (selectors.OPERATOR, Role.ADMIN)


def access_tenant(request, slug: str, *, manage: bool = False) -> TenantAccess:
    """The tenant `slug` as the signed-in person may see it; `manage=True` for changes (admins and operators)."""
    tenant = Tenant.objects.filter(slug=slug).first()
    role = selectors.tenant_role(tenant=tenant, user=request.user) if tenant is not None else None
    if role is None:
        raise Http404("No such tenant.")
    access = TenantAccess(tenant=tenant, role=role)
    if manage and not access.can_manage:
        raise PermissionDenied("Only the tenant's admins may do this.")
    return access


def operator_required(view):
    """Signed in and staff; anyone else gets the 404 an unknown page gets. Sync and async views alike."""
    if iscoroutinefunction(view):

        @login_required
        @wraps(view)
        async def wrapped_async(request, *args, **kwargs):
            if not (await request.auser()).is_staff:
                raise Http404("No such page.")
            return await view(request, *args, **kwargs)

        return wrapped_async

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_staff:
            raise Http404("No such page.")
        return view(request, *args, **kwargs)

    return wrapped
