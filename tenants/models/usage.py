"""Usage: one narrow row per inference request, and daily rollups per tenant and adapter."""

from django.db import models

from tenants.models.api_key import TenantAPIKey
from tenants.models.tenant import Tenant

# Upper bounds (ms) of the latency histogram buckets of a rollup; the last bucket is everything above.
LATENCY_BUCKET_BOUNDS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
NUM_LATENCY_BUCKETS = len(LATENCY_BUCKET_BOUNDS_MS) + 1


class UsageStatus(models.TextChoices):
    OK = "ok", "OK"
    ERROR = "error", "Error"
    CANCELLED = "cancelled", "Cancelled"


class UsageRecord(models.Model):
    request_id = models.CharField(max_length=100, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(TenantAPIKey, to_field="prefix", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    adapter = models.CharField(max_length=200, blank=True, default="")  # adapter name; "" = the base model
    prompt_tokens = models.PositiveIntegerField()
    completion_tokens = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=UsageStatus.choices)
    latency_ms = models.PositiveIntegerField()
    created_at = models.DateTimeField(db_index=True)
    # Sent from the web console's playground (session-authenticated, no API key), billed to the tenant all the same.
    playground = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="usage_tenant_time"),
            models.Index(fields=["tenant", "adapter", "created_at"], name="usage_tenant_adapter_time"),
        ]

    def __str__(self) -> str:
        return self.request_id


class UsageDaily(models.Model):
    """Sums over one UTC day of one tenant's requests to one adapter, rebuilt whole by each rollup of that day."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    adapter = models.CharField(max_length=200, blank=True, default="")
    num_requests = models.PositiveIntegerField(default=0)
    num_errors = models.PositiveIntegerField(default=0)
    num_cancelled = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    latency_ms_sum = models.PositiveBigIntegerField(default=0)
    # Counts per bucket of LATENCY_BUCKET_BOUNDS_MS (len NUM_LATENCY_BUCKETS), for p50/p95 on dashboards.
    latency_buckets = models.JSONField(default=list)

    class Meta:
        ordering = ["-day", "adapter"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "day", "adapter"], name="usagedaily_unique_tenant_day_adapter")
        ]
        indexes = [models.Index(fields=["day"], name="usagedaily_day")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day} {self.adapter or '-'}"
