"""The limiter under 200 concurrent reservations from 4 processes: no over-admission, exact counters."""

import multiprocessing
import time
from datetime import UTC, datetime

import pytest
import redis
from django.conf import settings

from tenants.limiter import QuotaLimiter, month_bounds
from tests.tenants.procs import reserve_burst

NUM_PROCESSES = 4
PER_PROCESS = 50
BIG = 10**9
QUOTA = dict(requests_per_minute=BIG, tokens_per_minute=BIG, monthly_tokens=BIG, max_concurrent_requests=BIG,
             default_max_tokens=10, max_tokens_limit=100, max_adapters=1, max_adapter_storage_bytes=1)


@pytest.fixture(scope="module")
def pool():
    with multiprocessing.get_context("spawn").Pool(NUM_PROCESSES) as workers:
        workers.map(time.sleep, [0] * NUM_PROCESSES)  # start the interpreters before any timing matters
        yield workers


def burst(pool, tenant_id: int, quota: dict, prompt: int, max_tokens: int, settle: int | None = None) -> list[int]:
    start_at = time.time() + 0.5
    args = [(settings.REDIS_URL, tenant_id, {**QUOTA, **quota}, PER_PROCESS, prompt, max_tokens, start_at, settle)
            for _ in range(NUM_PROCESSES)]
    return [tokens for admitted in pool.starmap(reserve_burst, args) for tokens in admitted]


def month_used(client, tenant_id: int) -> int:
    month = month_bounds(datetime.now(UTC))[0].strftime("%Y-%m")
    return int(client.hget(QuotaLimiter.keys(tenant_id, month)["month"], "used"))


@pytest.mark.parametrize(("quota", "expected"), [
    ({"requests_per_minute": 37}, 37),
    ({"tokens_per_minute": 1000}, 50),  # 20 tokens each
    ({"max_concurrent_requests": 7}, 7),
    ({"monthly_tokens": 610}, 30),
])
def test_exactly_the_limit_is_admitted_from_several_processes(pool, redis_db, quota, expected):
    admitted = burst(pool, 1, quota, prompt=10, max_tokens=10)
    assert len(admitted) == expected
    assert month_used(redis_db, 1) == 20 * expected  # the rebuilt-by-one-process counter holds every admission


def test_monthly_budget_is_never_overspent_by_settled_concurrent_requests(pool, redis_db):
    limit = 1_000
    # Each reserves 10 + 40 = 50 and really uses 10 + 0 (settled at once, freeing 40 for others).
    admitted = burst(pool, 2, {"monthly_tokens": limit}, prompt=10, max_tokens=40, settle=10)
    used = month_used(redis_db, 2)
    assert used == 10 * len(admitted)
    assert used <= limit  # reserved up front, so even the worst interleaving stays within the budget
    assert len(admitted) >= limit // 50  # and settling early lets more than the pessimistic count in


def test_counters_are_exact_after_concurrent_settles(pool, redis_db):
    admitted = burst(pool, 3, {}, prompt=7, max_tokens=13, settle=5)
    keys = QuotaLimiter.keys(3, "")
    assert len(admitted) == NUM_PROCESSES * PER_PROCESS
    assert int(redis_db.get(keys["tokens"])) == 5 * len(admitted)
    assert redis_db.zcard(keys["slots"]) == 0
    assert sorted({int(v) for v in redis_db.hvals(keys["costs"])}) == [5]
    assert month_used(redis_db, 3) == 5 * len(admitted)
    records = list(redis_db.scan_iter(match="quota:{t3}:rsv:*"))  # closed ones stay a while, as tombstones
    assert all(redis_db.hgetall(record) == {b"closed": b"1"} for record in records)  # none left open


def test_redis_db_is_isolated():
    assert redis.Redis.from_url(settings.REDIS_URL).connection_pool.connection_kwargs.get("db", 0) != 0
