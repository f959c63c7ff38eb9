"""Who is calling, as the gateway sees it after authenticating an API key: plain, cacheable, ORM-free data."""

from dataclasses import dataclass
from datetime import datetime

from tenants.effective_quota import EffectiveQuota
from tenants.priority import INTERACTIVE


@dataclass(frozen=True, slots=True)
class TenantInfo:
    id: int
    slug: str
    quota: EffectiveQuota


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A valid key: its tenant (with the quota in force), scopes and adapter restriction."""

    key_id: str  # the key's public prefix; usage rows and reservations name the key by it
    name: str
    tenant: TenantInfo
    scopes: frozenset[str]
    adapter_names: frozenset[str]  # empty: every adapter of the tenant
    expires_at: datetime | None
    priority: str = INTERACTIVE  # the key's own class; the tenant's (quota.priority) may still make it batch

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes

    def allows_adapter(self, adapter_name: str) -> bool:
        return not self.adapter_names or adapter_name in self.adapter_names


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Why a key was refused. `reason` is one of REASONS; `status` is the HTTP status to answer with."""

    reason: str
    message: str
    status: int

    REASONS = ("missing", "malformed", "unknown", "revoked", "expired", "suspended", "scope")

    @classmethod
    def of(cls, reason: str, detail: str = "") -> "AuthFailure":
        messages = {
            "missing": "No API key was given.",
            "malformed": "The API key is malformed.",
            "unknown": "The API key is not valid.",
            "revoked": "The API key has been revoked.",
            "expired": "The API key has expired.",
            "suspended": "The tenant of this API key is suspended.",
            "scope": f"The API key lacks the '{detail!s}' scope.",
        }
        if reason not in messages:
            raise ValueError(f"unknown auth failure reason {reason!r}; expected one of {cls.REASONS}")
        status = 403 if reason in ("suspended", "scope") else 401
        return cls(reason=reason, message=messages[reason], status=status)
