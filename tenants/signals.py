"""Deleting a tenant or an API key by any path (the admin, a shell) reaches every gateway process's key cache at
once, as a revocation does (tenants.key_auth): without this, their cached keys kept working for up to
API_KEY_CACHE_TTL_S, and the usage rows of those requests could not be written."""

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from tenants import login_throttle  # noqa: F401 - connects the sign-in failure counters
from tenants.models import Tenant, TenantAPIKey


@receiver(post_delete, sender=Tenant, dispatch_uid="tenants.tenant_deleted_bump")
@receiver(post_delete, sender=TenantAPIKey, dispatch_uid="tenants.key_deleted_bump")
def invalidate_cached_keys(sender, **kwargs) -> None:
    from tenants.key_auth import auth_generation_bump

    transaction.on_commit(auth_generation_bump, robust=True)
