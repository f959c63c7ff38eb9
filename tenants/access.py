"""How the console, the management API and the gateway's playground reach a tenant: 404 for anyone outside it
(never 403, which would reveal that it exists), 403 for someone in it without the role a change needs. Operators
(staff) reach every tenant; a `manage` API key acts as an admin of its own tenant and nothing else."""

from dataclasses import dataclass
from functools import wraps
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404

from tenants.api.authentication import KeyPrincipal
from tenants.models import Role, Tenant
from tenants.selectors import OPERATOR, tenant_role

_REFUSALS = {Role.ADMIN: "Only the tenant's admins may do this.", OPERATOR: "Only operators may do this."}


@dataclass(frozen=True, slots=True)
class TenantAccess:
    tenant: Tenant
    role: str  # OPERATOR, Role.ADMIN or Role.MEMBER

    @property
    def is_operator(self) -> bool:
        return self.role == OPERATOR

    @property
    def can_manage(self) -> bool:
        return self.role in (OPERATOR, Role.ADMIN)

    def allows(self, need: str) -> bool:
        """Whether this role may do what needs ``need``: Role.MEMBER, Role.ADMIN or OPERATOR."""
        return {Role.MEMBER: True, Role.ADMIN: self.can_manage, OPERATOR: self.is_operator}[need]


def tenant_access(*, user, slug: str) -> TenantAccess | None:
    """The tenant ``slug`` as ``user`` (a person or a KeyPrincipal) may see it; None when they are outside it or it
    does not exist, which callers answer alike."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        return None
    if isinstance(user, KeyPrincipal):
        role = Role.ADMIN if user.tenant_id == tenant.id else None
    else:
        role = tenant_role(tenant=tenant, user=user)
    return None if role is None else TenantAccess(tenant=tenant, role=role)


async def tenant_access_async(*, user, slug: str) -> TenantAccess | None:
    """:func:`tenant_access` for async views (the gateway's playground)."""
    return await sync_to_async(tenant_access)(user=user, slug=slug)


def access_tenant(request, slug: str, *, need: str = Role.MEMBER) -> TenantAccess:
    """The tenant ``slug`` as the caller may see it, or Http404; PermissionDenied when the caller's role is below
    ``need`` (Role.MEMBER, Role.ADMIN or OPERATOR)."""
    access = tenant_access(user=request.user, slug=slug)
    if access is None:
        raise Http404("No such tenant.")
    if not access.allows(need):
        raise PermissionDenied(_REFUSALS[need])
    return access


def require_operator(request) -> None:
    """PermissionDenied unless a signed-in operator is asking (management API calls that span tenants)."""
    if isinstance(request.user, KeyPrincipal) or not request.user.is_staff:
        raise PermissionDenied(_REFUSALS[OPERATOR])


def operator_required(view):
    """Signed in and staff; anyone else gets the 404 an unknown page gets (console pages). Sync and async views
    alike."""
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
