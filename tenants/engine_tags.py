"""Opaque per-tenant values the engines are given (ENGINE_PROTOCOL.md): keyed hashes of the tenant id under
SECRET_KEY, never its name. They live here, below the gateway and the schema registry, because both must derive the
same value: the gateway salts every request with it, and a registered schema's warm compile only warms the cache
scope that tenant's requests look in when it carries the same salt."""

import hashlib
import hmac

from django.conf import settings


def _tenant_tag(purpose: str, tenant_id: int) -> str:
    """An opaque, stable per-tenant value: it cannot be traced back to the tenant without the secret key."""
    return hmac.new(settings.SECRET_KEY.encode(), f"{purpose}:{tenant_id}".encode(), hashlib.sha256).hexdigest()[:32]


def fairness_key(tenant_id: int) -> str:
    """The tenant's key for the engine's fair scheduling."""
    return _tenant_tag("fairness", tenant_id)


def cache_salt(tenant_id: int) -> str:
    """The tenant's salt of the engine's prefix cache and compiled grammars: its requests (API keys and playground
    alike) share cached KV and grammars with each other and never with another tenant's, so no tenant can time
    another's prompts or schemas."""
    return _tenant_tag("cache-salt", tenant_id)
