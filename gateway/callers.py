"""Who is calling: a tenant's API key (the OpenAI-compatible API) or a signed-in person (the console's playground).

Both end as a :class:`Caller`, so the playground goes through exactly the same path as API traffic and is billed
to the tenant; its usage rows are marked ``playground``.
"""

from dataclasses import dataclass

from gateway.errors import GatewayError
from tenants.access import tenant_access_async
from tenants.identity import KeyInfo, TenantInfo
from tenants.key_auth import authenticate_api_key, cached_api_key
from tenants.models import Scope
from tenants.priority import INTERACTIVE, effective_priority
from tenants.selectors import quota_effective_async


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: TenantInfo
    key_id: str | None  # the API key's prefix; None for the playground
    adapter_names: frozenset[str]  # adapters this caller may use; empty: all of the tenant's
    playground: bool = False
    key_priority: str = INTERACTIVE  # the API key's own class (the playground has no key)

    def allows_adapter(self, name: str) -> bool:
        return not self.adapter_names or name in self.adapter_names

    @property
    def fairness_weight(self) -> int:
        """The tenant's weight in the engines' fair scheduling (its plan, set by operators)."""
        return self.tenant.quota.fairness_weight

    @property
    def priority(self) -> str:
        """The class the engines serve this caller's requests in: batch when its tenant or its key says so."""
        return effective_priority(self.tenant.quota.priority, self.key_priority)

    @classmethod
    def of_key(cls, key: KeyInfo) -> "Caller":
        return cls(tenant=key.tenant, key_id=key.key_id, adapter_names=key.adapter_names, key_priority=key.priority)


def bearer_token(request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def caller_from_key(request) -> Caller:
    """The caller behind ``Authorization: Bearer <key>`` with the inference scope; 401/403 otherwise."""
    result = await authenticate_api_key(bearer_token(request), scope=Scope.INFERENCE)
    if not isinstance(result, KeyInfo):
        code = {"scope": "insufficient_scope", "suspended": "tenant_suspended"}.get(result.reason, "invalid_api_key")
        raise GatewayError(result.status, result.message, code=code)
    return Caller.of_key(result)


def provisional_caller(request) -> Caller | None:
    """The caller behind the key as this process last confirmed it (no I/O), or None when not cached: to start
    work on while :func:`caller_from_key` confirms it."""
    key = cached_api_key(bearer_token(request), scope=Scope.INFERENCE)
    return None if key is None else Caller.of_key(key)


async def caller_from_session(request, slug: str) -> Caller:
    """The signed-in person acting for tenant ``slug`` in the playground: its members and operators.

    Anyone else gets the 404 an unknown tenant gets (never a 403 that would reveal it exists)."""
    user = await request.auser()
    if not user.is_authenticated or not user.is_active:
        raise GatewayError(401, "Sign in to use the playground.", code="not_authenticated")
    access = await tenant_access_async(user=user, slug=slug)
    if access is None:
        raise GatewayError(404, "No such tenant.", code="not_found")
    tenant = access.tenant
    if not tenant.is_active:
        raise GatewayError(403, "This tenant is suspended.", code="tenant_suspended")
    quota = await quota_effective_async(tenant=tenant)
    return Caller(tenant=TenantInfo(id=tenant.id, slug=tenant.slug, quota=quota), key_id=None,
                  adapter_names=frozenset(), playground=True)
