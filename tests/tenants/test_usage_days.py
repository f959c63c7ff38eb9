"""Usage by day for dashboards: final rollups for settled days, live sums of raw rows for yesterday and today."""

from datetime import UTC, datetime, timedelta

import pytest

from tenants import services, usage_days
from tenants.models import UsageStatus
from tests.tenants.factories import TenantFactory, record

pytestmark = pytest.mark.django_db
TODAY = datetime.now(UTC).date()


def test_live_days_are_today_and_yesterday():
    assert usage_days.first_live_day(TODAY) == TODAY - timedelta(days=1)


def test_settled_days_come_from_rollups_and_live_days_from_raw_rows():
    tenant = TenantFactory()
    old = TODAY - timedelta(days=5)
    record(tenant, 1, day=old, adapter="sql", prompt=10, completion=5)
    services.usage_rollup_day(day=old)
    record(tenant, 2, day=old, adapter="sql", prompt=1000)  # after the final rollup: a settled day does not move
    record(tenant, 3, day=TODAY - timedelta(days=1), adapter="chat", prompt=7, completion=3, latency_ms=30)
    record(tenant, 4, day=TODAY, adapter="", prompt=2, completion=2, status=UsageStatus.ERROR, latency_ms=3000)
    rows = usage_days.usage_days(tenant=tenant, since=old, until=TODAY)
    assert [(row["day"], row["adapter"], row["num_requests"], row["prompt_tokens"], row["completion_tokens"])
            for row in rows] == [
        (old, "sql", 1, 10, 5),
        (TODAY - timedelta(days=1), "chat", 1, 7, 3),
        (TODAY, "", 1, 2, 2),
    ]
    live = rows[2]
    assert live["num_errors"] == 1 and sum(live["latency_buckets"]) == 1
    assert live["latency_buckets"][7] == 1  # 2500 <= 3000 ms < 5000
    assert rows[1]["latency_buckets"][1] == 1  # 25 <= 30 ms < 50


def test_live_sums_equal_the_rollup_of_the_same_day():
    tenant = TenantFactory()
    for n in range(20):
        record(tenant, n, adapter=["a", "b"][n % 2], latency_ms=n * 400, prompt=n, completion=2 * n,
               status=[UsageStatus.OK, UsageStatus.CANCELLED][n % 3 == 0], hour=n)
    live = usage_days.usage_days(tenant=tenant, since=TODAY, until=TODAY)
    services.usage_rollup_day(day=TODAY)
    settled = usage_days.usage_days(tenant=tenant, since=TODAY, until=TODAY, today=TODAY + timedelta(days=5))
    assert live == settled and len(live) == 2


def test_other_tenants_rows_stay_out_and_none_means_every_tenant():
    mine, theirs = TenantFactory(), TenantFactory()
    record(mine, 1)
    record(theirs, 2, prompt=50)
    assert [row["tenant_id"] for row in usage_days.usage_days(tenant=mine, since=TODAY, until=TODAY)] == [mine.pk]
    assert len(usage_days.usage_days(tenant=None, since=TODAY, until=TODAY)) == 2


def test_totals_over_a_range():
    tenant = TenantFactory()
    old = TODAY - timedelta(days=3)
    record(tenant, 1, day=old, prompt=10, completion=5)
    services.usage_rollup_day(day=old)
    record(tenant, 2, prompt=1, completion=2)
    record(tenant, 3, prompt=3, completion=4)
    assert usage_days.usage_totals(tenant=tenant, since=old, until=TODAY) == {
        "num_requests": 3, "prompt_tokens": 14, "completion_tokens": 11, "tokens": 25}
    assert usage_days.usage_totals(tenant=tenant, since=TODAY, until=TODAY)["tokens"] == 10


def test_top_merges_settled_and_live_days_and_ranks_by_tokens():
    small, big = TenantFactory(), TenantFactory()
    old = TODAY - timedelta(days=4)
    record(big, 1, day=old, adapter="sql", prompt=100, completion=0)
    record(small, 2, day=old, adapter="chat", prompt=30, completion=0)
    services.usage_rollup_day(day=old)
    record(big, 3, adapter="sql", prompt=5, completion=5)
    record(small, 4, adapter="chat", prompt=10, completion=0)
    record(small, 5, adapter="", prompt=1, completion=0)
    tenants = usage_days.usage_top(since=old, until=TODAY, by=("tenant_id",))
    assert [(row["tenant_id"], row["num_requests"], row["tokens"]) for row in tenants] == [
        (big.pk, 2, 110), (small.pk, 3, 41)]
    adapters = usage_days.usage_top(since=old, until=TODAY, by=("tenant_id", "adapter"), limit=2)
    assert [(row["tenant_id"], row["adapter"], row["tokens"]) for row in adapters] == [
        (big.pk, "sql", 110), (small.pk, "chat", 40)]


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="after"):
        usage_days.usage_days(tenant=None, since=TODAY, until=TODAY - timedelta(days=1))
    with pytest.raises(ValueError, match="groups by"):
        usage_days.usage_top(since=TODAY, until=TODAY, by=("day",))
