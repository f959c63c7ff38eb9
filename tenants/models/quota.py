"""A tenant's quota overrides (NULL = the platform default) and the audit trail of every change."""

from django.conf import settings
from django.db import models

from tenants.models.tenant import Tenant
from tenants.priority import PRIORITY_NAMES

QUOTA_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "monthly_tokens",
    "max_concurrent_requests",
    "default_max_tokens",
    "max_tokens_limit",
    "max_adapters",
    "max_adapter_storage_bytes",
    "fairness_weight",
    "priority_class",
)


class Quota(models.Model):
    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="quota")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)
    # A request without max_tokens reserves default_max_tokens, so it does not reserve the whole context.
    default_max_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_tokens_limit = models.PositiveIntegerField(null=True, blank=True)
    max_adapters = models.PositiveIntegerField(null=True, blank=True)
    max_adapter_storage_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Fair service when the engines are full: the tenant's share weight (1..1000) and its class as a code of
    # tenants.priority (1 interactive, 2 batch), an integer so that it is audited like every other limit.
    fairness_weight = models.PositiveSmallIntegerField(null=True, blank=True)
    priority_class = models.PositiveSmallIntegerField(null=True, blank=True, choices=sorted(PRIORITY_NAMES.items()))
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.tenant_id}"


class QuotaChange(models.Model):
    """One changed field of one quota: who, when, old and new (NULL = platform default)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quota_changes")
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    changed_at = models.DateTimeField(auto_now_add=True)
    field = models.CharField(max_length=40)
    old_value = models.BigIntegerField(null=True)
    new_value = models.BigIntegerField(null=True)
    # How the change came in when no person is attached (a management command).
    source = models.CharField(max_length=40, default="api")

    class Meta:
        ordering = ["-changed_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-changed_at"], name="quotachange_tenant_time")]

    def __str__(self) -> str:
        return f"{self.field}: {self.old_value} -> {self.new_value}"
