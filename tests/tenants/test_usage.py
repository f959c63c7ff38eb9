"""Usage rows, daily rollups (equal to the raw rows' sums), retention, percentiles and the month rebuild."""

import random
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Sum

from tenants import selectors, services, tasks
from tenants.effective_quota import EffectiveQuota
from tenants.identity import TenantInfo
from tenants.limiter import QuotaLimiter, Reservation
from tenants.models import LATENCY_BUCKET_BOUNDS_MS, UsageDaily, UsageRecord, UsageStatus
from tests.tenants.factories import TenantFactory, record

pytestmark = pytest.mark.django_db
TODAY = datetime.now(UTC).date()


def test_one_row_per_request_id():
    tenant = TenantFactory()
    record(tenant, 1, prompt=10)
    record(tenant, 1, prompt=99)  # a retry of the same request
    assert list(UsageRecord.objects.values_list("prompt_tokens", flat=True)) == [10]


def test_bad_rows_are_value_errors():
    tenant = TenantFactory()
    for bad in ({"status": "weird"}, {"prompt": -1}, {"latency_ms": 1.5}):
        with pytest.raises(ValueError):
            record(tenant, 1, **bad)


def test_async_write_for_the_gateway():
    tenant = TenantFactory()
    write = async_to_sync(services.usage_record_create_async)
    for _ in range(2):
        write(request_id="r1", tenant_id=tenant.pk, api_key_id=None, adapter="sql", prompt_tokens=3,
              completion_tokens=4, status="ok", latency_ms=12)
    assert UsageRecord.objects.filter(tenant=tenant).count() == 1


def test_playground_rows_are_marked_and_billed_to_the_tenant():
    tenant = TenantFactory()
    write = async_to_sync(services.usage_record_create_async)
    write(request_id="p1", tenant_id=tenant.pk, api_key_id=None, adapter="", prompt_tokens=5, completion_tokens=6,
          status="ok", latency_ms=20, playground=True)
    write(request_id="k1", tenant_id=tenant.pk, api_key_id=None, adapter="", prompt_tokens=1, completion_tokens=2,
          status="ok", latency_ms=20)
    rows = dict(UsageRecord.objects.filter(tenant=tenant).values_list("request_id", "playground"))
    assert rows == {"p1": True, "k1": False}
    assert selectors.usage_tokens_between_sync(tenant_id=tenant.pk, start=datetime.now(UTC) - timedelta(hours=1),
                                               end=datetime.now(UTC) + timedelta(hours=1)) == 14


def test_rollup_equals_the_sum_of_raw_rows_and_is_idempotent():
    rng = random.Random(7)
    tenants = [TenantFactory(), TenantFactory()]
    yesterday = TODAY - timedelta(days=1)
    for n in range(300):
        record(rng.choice(tenants), n, day=rng.choice([TODAY, yesterday]), adapter=rng.choice(["", "sql", "chat"]),
               latency_ms=rng.randrange(0, 90_000), status=rng.choice(UsageStatus.values),
               prompt=rng.randrange(0, 500), completion=rng.randrange(0, 500), hour=rng.randrange(24))
    for _ in range(2):
        assert tasks.usage_rollup_recent() == UsageRecord.objects.values("tenant", "adapter", "created_at__date")\
            .distinct().count()
    assert UsageDaily.objects.count() == 2 * 2 * 3
    for row in UsageDaily.objects.all():
        raw = UsageRecord.objects.filter(tenant=row.tenant, adapter=row.adapter, created_at__date=row.day)
        sums = raw.aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"), lat=Sum("latency_ms"))
        assert (row.num_requests, row.prompt_tokens, row.completion_tokens, row.latency_ms_sum) == (
            raw.count(), sums["p"], sums["c"], sums["lat"])
        assert row.num_errors == raw.filter(status=UsageStatus.ERROR).count()
        assert row.num_cancelled == raw.filter(status=UsageStatus.CANCELLED).count()
        assert sum(row.latency_buckets) == row.num_requests
        assert row.latency_buckets[0] == raw.filter(latency_ms__lt=LATENCY_BUCKET_BOUNDS_MS[0]).count()
        assert row.latency_buckets[-1] == raw.filter(latency_ms__gte=LATENCY_BUCKET_BOUNDS_MS[-1]).count()


def test_rerun_picks_up_late_rows_and_drops_vanished_groups():
    tenant = TenantFactory()
    record(tenant, 1, adapter="sql")
    services.usage_rollup_day(day=TODAY)
    record(tenant, 2, adapter="sql")
    record(tenant, 3, adapter="chat")
    services.usage_rollup_day(day=TODAY)
    assert dict(UsageDaily.objects.values_list("adapter", "num_requests")) == {"sql": 2, "chat": 1}
    UsageRecord.objects.filter(adapter="chat").delete()
    services.usage_rollup_day(day=TODAY)
    assert dict(UsageDaily.objects.values_list("adapter", "num_requests")) == {"sql": 2}


def test_purge_rolls_up_before_deleting_and_past_days_are_then_final(settings):
    settings.USAGE_RAW_RETENTION_DAYS = 10
    tenant = TenantFactory()
    old, recent = TODAY - timedelta(days=11), TODAY - timedelta(days=9)
    record(tenant, 1, day=old)
    record(tenant, 2, day=old)
    record(tenant, 3, day=recent)
    assert tasks.usage_purge() == 2
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == [f"req-{tenant.pk}-3"]
    assert UsageDaily.objects.get(day=old).num_requests == 2
    with pytest.raises(ValidationError, match="past retention"):
        services.usage_rollup_day(day=old)
    assert UsageDaily.objects.get(day=old).num_requests == 2


@pytest.mark.parametrize(("buckets", "q", "expected"), [
    ([0] * 12, 0.5, None),
    ([10] + [0] * 11, 0.5, 12.5),  # half-way through [0, 25)
    ([0, 0, 4, 4] + [0] * 8, 0.5, 100.0),  # the top of [50, 100)
    ([0, 0, 4, 4] + [0] * 8, 0.95, 100 + 150 * (7.6 - 4) / 4),
    ([0] * 11 + [3], 0.95, 60000.0),  # the open last bucket answers its lower bound
])
def test_latency_percentile(buckets, q, expected):
    result = selectors.latency_percentile(buckets, q)
    assert result is None if expected is None else result == pytest.approx(expected)


def test_summary_over_rollups():
    tenant = TenantFactory()
    for n, latency in enumerate([10, 20, 30, 40, 5000]):
        record(tenant, n, latency_ms=latency, status=UsageStatus.ERROR if n == 4 else UsageStatus.OK)
    services.usage_rollup_day(day=TODAY)
    summary = selectors.usage_summary(rows=selectors.usage_daily_list(tenant=tenant))
    assert (summary["num_requests"], summary["num_errors"], summary["prompt_tokens"]) == (5, 1, 50)
    assert 25 <= summary["latency_ms_p50"] <= 50 and summary["latency_ms_p95"] >= 2500


def test_month_counter_is_rebuilt_from_the_usage_table(redis_db):
    tenant = TenantFactory()
    record(tenant, 1, prompt=400, completion=100)  # this month
    record(tenant, 2, day=TODAY.replace(day=1) - timedelta(days=1), prompt=7000)  # last month: not counted
    info = TenantInfo(id=tenant.pk, slug=tenant.slug, quota=EffectiveQuota(**{
        **settings.TENANT_QUOTA_DEFAULTS, "monthly_tokens": 600, "default_max_tokens": 50}))

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        limiter = QuotaLimiter(client)  # the default loader: the usage table
        try:
            first = await limiter.reserve(info, None, 40, None)  # 500 + 90 = 590 <= 600
            second = await limiter.reserve(info, None, 1, 10)  # 601 > 600
            used = await client.hget(limiter.keys(tenant.pk, first.month)["month"], "used")
            return first, second, int(used)
        finally:
            await client.aclose()

    first, second, used = async_to_sync(scenario)()
    assert isinstance(first, Reservation) and not isinstance(second, Reservation)
    assert used == 590
