from tenants.models.api_key import Scope, TenantAPIKey
from tenants.models.quota import QUOTA_FIELDS, Quota, QuotaChange
from tenants.models.tenant import Invitation, Membership, Role, Tenant
from tenants.models.usage import (
    LATENCY_BUCKET_BOUNDS_MS,
    NUM_LATENCY_BUCKETS,
    UsageDaily,
    UsageRecord,
    UsageStatus,
)

__all__ = [
    "LATENCY_BUCKET_BOUNDS_MS",
    "NUM_LATENCY_BUCKETS",
    "QUOTA_FIELDS",
    "Invitation",
    "Membership",
    "Quota",
    "QuotaChange",
    "Role",
    "Scope",
    "Tenant",
    "TenantAPIKey",
    "UsageDaily",
    "UsageRecord",
    "UsageStatus",
]
