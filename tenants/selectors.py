"""Reads. Every selector of tenant data takes the tenant; nothing here writes."""

from datetime import UTC, date, datetime, time

from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone

from tenants.effective_quota import EffectiveQuota
from tenants.identity import AuthFailure, KeyInfo, TenantInfo
from tenants.models import (
    LATENCY_BUCKET_BOUNDS_MS,
    NUM_LATENCY_BUCKETS,
    QUOTA_FIELDS,
    Invitation,
    Membership,
    Quota,
    QuotaChange,
    Tenant,
    TenantAPIKey,
    UsageDaily,
    UsageRecord,
)

# ---------------------------------------------------------------- tenants and people

OPERATOR = "operator"  # the role of staff users in every tenant: they see and manage all of them



def tenant_list(*, user) -> QuerySet[Tenant]:
    """Every tenant for an operator (staff), else the tenants the user belongs to."""
    tenants = Tenant.objects.all()
    if user.is_staff:
        return tenants
    return tenants.filter(memberships__user=user)


def tenant_search(*, query: str = "", status: str = "") -> QuerySet[Tenant]:
    """Tenants (operators) whose name or slug contains `query`, of `status` when given, with num_members."""
    tenants = Tenant.objects.annotate(num_members=Count("memberships"))
    if query.strip():
        tenants = tenants.filter(Q(name__icontains=query.strip()) | Q(slug__icontains=query.strip()))
    if status:
        tenants = tenants.filter(status=status)
    return tenants.order_by("slug")


def tenants_by_id(*, ids) -> dict[int, Tenant]:
    return {tenant.pk: tenant for tenant in Tenant.objects.filter(pk__in=list(ids))}


def membership_tenant_list(*, user) -> QuerySet[Tenant]:
    """The tenants the user is a member of (operators included: only those they belong to)."""
    return Tenant.objects.filter(memberships__user=user).order_by("name", "slug")


def user_by_email(*, email: str):
    """The (oldest) account with this email, case-insensitively, or None."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(email__iexact=email.strip()).order_by("id").first()


def membership_role(*, tenant: Tenant, user) -> str | None:
    return Membership.objects.filter(tenant=tenant, user=user).values_list("role", flat=True).first()


def tenant_role(*, tenant: Tenant, user) -> str | None:
    """The user's role in the tenant: OPERATOR for staff, "admin" or "member" for its people, None for anyone
    else (who must not learn that the tenant exists)."""
    if not user.is_authenticated or not user.is_active:
        return None
    if user.is_staff:
        return OPERATOR
    return membership_role(tenant=tenant, user=user)


def membership_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__email", "id")


def invitation_list(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(tenant=tenant).select_related("invited_by")


def invitation_pending(*, token: str) -> Invitation | None:
    """The unused, unexpired invitation with this token, or None."""
    return (Invitation.objects.select_related("tenant")
            .filter(token_hash=Invitation.hash_token(token), accepted_at__isnull=True, expires_at__gt=timezone.now())
            .first())


# ---------------------------------------------------------------- quotas


def quota_overrides(*, tenant: Tenant) -> dict[str, int | None]:
    """The tenant's own values (None = platform default) for each quota field."""
    quota = Quota.objects.filter(tenant=tenant).first()
    return {name: getattr(quota, name) if quota else None for name in QUOTA_FIELDS}


def quota_effective(*, tenant: Tenant) -> EffectiveQuota:
    from django.conf import settings

    return EffectiveQuota.merge(settings.TENANT_QUOTA_DEFAULTS, quota_overrides(tenant=tenant))


def quota_change_list(*, tenant: Tenant) -> QuerySet[QuotaChange]:
    return QuotaChange.objects.filter(tenant=tenant).select_related("changed_by")


# ---------------------------------------------------------------- API keys


def api_key_list(*, tenant: Tenant) -> QuerySet[TenantAPIKey]:
    return TenantAPIKey.objects.filter(tenant=tenant).select_related("created_by")


def api_key_get(*, tenant: Tenant, prefix: str) -> TenantAPIKey:
    """The tenant's key with this prefix; TenantAPIKey.DoesNotExist for another tenant's key."""
    return api_key_list(tenant=tenant).get(prefix=prefix)


def api_key_check(key: TenantAPIKey | None, raw_key: str) -> AuthFailure | None:
    """Why `raw_key` (whose prefix found `key`) may not be used, or None when it may."""
    if key is None or not TenantAPIKey.objects.key_generator.verify(raw_key, key.hashed_key):
        return AuthFailure.of("unknown")
    if key.revoked:
        return AuthFailure.of("revoked")
    if key.has_expired:
        return AuthFailure.of("expired")
    if not key.tenant.is_active:
        return AuthFailure.of("suspended")
    return None


def api_key_authenticate(raw_key: str, *, scope: str) -> TenantAPIKey | AuthFailure:
    """Synchronous, uncached check of a raw key (the management API's low traffic needs no cache)."""
    prefix = raw_key.partition(".")[0]
    key = TenantAPIKey.objects.select_related("tenant").filter(prefix=prefix).first()
    failure = api_key_check(key, raw_key)
    if failure is None and scope not in key.scopes:
        failure = AuthFailure.of("scope", scope)
    return failure or key


async def api_key_lookup_async(raw_key: str) -> KeyInfo | AuthFailure:
    prefix = raw_key.partition(".")[0]
    key = await TenantAPIKey.objects.select_related("tenant").filter(prefix=prefix).afirst()
    failure = api_key_check(key, raw_key)
    if failure is not None:
        return failure
    quota = await quota_effective_async(tenant=key.tenant)
    return KeyInfo(
        key_id=key.prefix, name=key.name, tenant=TenantInfo(id=key.tenant.id, slug=key.tenant.slug, quota=quota),
        scopes=frozenset(key.scopes), adapter_names=frozenset(key.adapter_names), expires_at=key.expiry_date,
        priority=key.priority,
    )


async def quota_effective_async(*, tenant: Tenant) -> EffectiveQuota:
    """:func:`quota_effective` for async code (the gateway's playground)."""
    from django.conf import settings

    quota = await Quota.objects.filter(tenant=tenant).afirst()
    overrides = {name: getattr(quota, name) if quota else None for name in QUOTA_FIELDS}
    return EffectiveQuota.merge(settings.TENANT_QUOTA_DEFAULTS, overrides)


# ---------------------------------------------------------------- usage


def usage_record_list(*, tenant: Tenant) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(tenant=tenant)


def usage_daily_list(*, tenant: Tenant | None) -> QuerySet[UsageDaily]:
    """Rollup rows of one tenant, or of every tenant when `tenant` is None (operators only)."""
    rows = UsageDaily.objects.select_related("tenant")
    return rows if tenant is None else rows.filter(tenant=tenant)


def usage_tokens_between_sync(*, tenant_id: int, start: datetime, end: datetime) -> int:
    rows = UsageRecord.objects.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end)
    return rows.aggregate(total=Sum(F("prompt_tokens") + F("completion_tokens")))["total"] or 0


async def usage_tokens_between(*, tenant_id: int, start: datetime, end: datetime) -> int:
    """Tokens (prompt + completion) of the tenant's usage rows in [start, end): rebuilds the month counter."""
    rows = UsageRecord.objects.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end)
    result = await rows.aaggregate(total=Sum(F("prompt_tokens") + F("completion_tokens")))
    return result["total"] or 0


def usage_summary(*, rows: QuerySet[UsageDaily]) -> dict:
    """Totals over rollup rows, with p50/p95 latency from their summed histograms."""
    totals = rows.aggregate(
        num_requests=Sum("num_requests"), num_errors=Sum("num_errors"), num_cancelled=Sum("num_cancelled"),
        prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
    )
    buckets = [0] * NUM_LATENCY_BUCKETS
    for row_buckets in rows.values_list("latency_buckets", flat=True):
        for i, count in enumerate(row_buckets):
            buckets[i] += count
    summary = {name: value or 0 for name, value in totals.items()}
    summary["latency_ms_p50"] = latency_percentile(buckets, 0.50)
    summary["latency_ms_p95"] = latency_percentile(buckets, 0.95)
    return summary


def latency_percentile(buckets: list[int], q: float) -> float | None:
    """The q-quantile of a LATENCY_BUCKET_BOUNDS_MS histogram, interpolated linearly inside its bucket.
    The open last bucket answers its lower bound. None for an empty histogram."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(buckets):
        if count and seen + count >= rank:
            lower = LATENCY_BUCKET_BOUNDS_MS[i - 1] if i > 0 else 0
            if i == len(LATENCY_BUCKET_BOUNDS_MS):
                return float(lower)
            upper = LATENCY_BUCKET_BOUNDS_MS[i]
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
    return float(LATENCY_BUCKET_BOUNDS_MS[-1])


def usage_days_with_raw_rows(*, before: date) -> list[date]:
    """UTC days before `before` that still hold raw usage rows (what a purge must roll up first)."""
    start = datetime.combine(before, time.min, tzinfo=UTC)
    moments = UsageRecord.objects.filter(created_at__lt=start).datetimes("created_at", "day", tzinfo=UTC)
    return [moment.date() for moment in moments]
