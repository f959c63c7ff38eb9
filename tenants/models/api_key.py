"""API keys of a tenant, on djangorestframework-api-key: a public prefix plus a random secret, stored hashed.

The raw key is `<prefix>.<secret>`; it exists only in the response that creates it.
"""

from django.conf import settings
from django.db import models
from rest_framework_api_key.models import AbstractAPIKey

from tenants.models.tenant import Tenant
from tenants.priority import INTERACTIVE, PRIORITY_CHOICES


class Scope(models.TextChoices):
    INFERENCE = "inference", "Inference"
    MANAGE = "manage", "Manage"


class TenantAPIKey(AbstractAPIKey):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # A list of Scope values, kept as JSON so SQLite (`make run`) and PostgreSQL share one schema.
    scopes = models.JSONField(default=list)
    # Adapter names this key may use; empty means every adapter of the tenant. Names, not foreign keys: the
    # restriction outlives versions of an adapter and does not tie this app to the adapter registry's tables.
    adapter_names = models.JSONField(default=list, blank=True)
    # `batch` marks the key's requests for after interactive ones; an interactive key of a batch tenant stays batch.
    priority = models.CharField(max_length=16, choices=PRIORITY_CHOICES, default=INTERACTIVE)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "tenant API key"
        verbose_name_plural = "tenant API keys"
        indexes = [models.Index(fields=["tenant", "-created"], name="apikey_tenant_created")]
