"""Usage by UTC day for dashboards: the rollups of settled days plus live sums of the days still changing.

The beat's rollup rebuilds yesterday and today (late rows), so those two days are summed from the raw rows here
(raw rows outlive them: USAGE_RAW_RETENTION_DAYS >= 2) and every earlier day comes from its final rollup. A
dashboard therefore shows a request the moment its usage row is written, and never counts a day twice.
"""

from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from tenants.models import LATENCY_BUCKET_BOUNDS_MS, NUM_LATENCY_BUCKETS, Tenant, UsageDaily, UsageRecord, UsageStatus

# The summed fields of a day's group, as in UsageDaily.
COUNT_FIELDS = ("num_requests", "num_errors", "num_cancelled", "prompt_tokens", "completion_tokens", "latency_ms_sum")
LIVE_DAYS = 2  # today and yesterday: the days `tenants.tasks.usage_rollup_recent` still rebuilds


def first_live_day(today: date | None = None) -> date:
    today = today or timezone.now().astimezone(UTC).date()
    return today - timedelta(days=LIVE_DAYS - 1)


def _bucket_counts() -> dict:
    bounds = (0, *LATENCY_BUCKET_BOUNDS_MS)
    counts = {f"b{i}": Count("id", filter=Q(latency_ms__gte=lo, latency_ms__lt=hi))
              for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))}
    counts[f"b{len(LATENCY_BUCKET_BOUNDS_MS)}"] = Count("id", filter=Q(latency_ms__gte=LATENCY_BUCKET_BOUNDS_MS[-1]))
    return counts


def usage_raw_groups(*, since: date, until: date, tenant: Tenant | None = None) -> list[dict]:
    """Raw rows of the UTC days [since, until] summed per tenant, day and adapter, exactly as a rollup sums them:
    dicts with tenant_id, day, adapter, the COUNT_FIELDS and latency_buckets (NUM_LATENCY_BUCKETS counts)."""
    start = datetime.combine(since, time.min, tzinfo=UTC)
    end = datetime.combine(until + timedelta(days=1), time.min, tzinfo=UTC)
    rows = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    groups = (
        rows.order_by().annotate(day=TruncDate("created_at", tzinfo=UTC)).values("tenant_id", "day", "adapter")
        .annotate(num_requests=Count("id"), num_errors=Count("id", filter=Q(status=UsageStatus.ERROR)),
                  num_cancelled=Count("id", filter=Q(status=UsageStatus.CANCELLED)),
                  prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
                  latency_ms_sum=Sum("latency_ms"), **_bucket_counts())
    )
    return [
        {"tenant_id": g["tenant_id"], "day": g["day"], "adapter": g["adapter"],
         **{name: g[name] for name in COUNT_FIELDS},
         "latency_buckets": [g[f"b{i}"] for i in range(NUM_LATENCY_BUCKETS)]}
        for g in groups
    ]


def usage_days(*, tenant: Tenant | None, since: date, until: date, today: date | None = None) -> list[dict]:
    """One dict per (tenant, day, adapter) with usage in [since, until], shaped as `usage_raw_groups`' rows,
    ordered by day then adapter. `tenant=None` is every tenant (operators only)."""
    if since > until:
        raise ValueError(f"since ({since}) is after until ({until})")
    live = first_live_day(today)
    rows: list[dict] = []
    if since < live:
        settled = UsageDaily.objects.filter(day__gte=since, day__lte=min(until, live - timedelta(days=1)))
        if tenant is not None:
            settled = settled.filter(tenant=tenant)
        rows += settled.order_by().values("tenant_id", "day", "adapter", *COUNT_FIELDS, "latency_buckets")
    if until >= live:
        rows += usage_raw_groups(since=max(since, live), until=until, tenant=tenant)
    rows.sort(key=lambda row: (row["day"], row["adapter"], row["tenant_id"]))
    return rows


def usage_totals(*, tenant: Tenant, since: date, until: date, today: date | None = None) -> dict[str, int]:
    """Requests and tokens of the tenant over the UTC days [since, until]."""
    totals = dict.fromkeys(("num_requests", "prompt_tokens", "completion_tokens"), 0)
    for row in usage_days(tenant=tenant, since=since, until=until, today=today):
        for name in totals:
            totals[name] += row[name]
    totals["tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    return totals


def usage_top(*, since: date, until: date, by: Iterable[str], limit: int = 10,
              today: date | None = None) -> list[dict]:
    """Across all tenants (operators): usage over [since, until] summed per `by` (a subset of "tenant_id" and
    "adapter"), the `limit` largest by tokens first; each dict has the `by` keys, num_requests, num_errors,
    prompt_tokens, completion_tokens and tokens."""
    by = tuple(by)
    if not by or set(by) - {"tenant_id", "adapter"}:
        raise ValueError(f"usage_top groups by tenant_id and/or adapter, got {by!r}")
    live = first_live_day(today)
    sums = {name: Sum(name) for name in ("num_requests", "num_errors", "prompt_tokens", "completion_tokens")}
    parts: list[dict] = []
    if since < live:
        settled = UsageDaily.objects.filter(day__gte=since, day__lte=min(until, live - timedelta(days=1)))
        parts += settled.order_by().values(*by).annotate(**sums)
    if until >= live:
        parts += usage_raw_groups(since=max(since, live), until=until)
    merged: dict[tuple, dict] = {}
    for part in parts:
        group = merged.setdefault(tuple(part[name] for name in by), {
            **{name: part[name] for name in by}, **dict.fromkeys(sums, 0)})
        for name in sums:
            group[name] += part[name] or 0
    for group in merged.values():
        group["tokens"] = group["prompt_tokens"] + group["completion_tokens"]
    ranked = sorted(merged.values(), key=lambda g: (-g["tokens"], -g["num_requests"], *(str(g[n]) for n in by)))
    return ranked[:limit]
