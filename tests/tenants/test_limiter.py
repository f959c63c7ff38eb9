"""QuotaLimiter in one process: exact bookkeeping of the window, slots and month counter in Redis."""

import asyncio
import time
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from django.conf import settings

from tenants.effective_quota import EffectiveQuota
from tenants.identity import TenantInfo
from tenants.limiter import QuotaLimiter, Refusal, Reservation, format_duration, month_bounds

# A window (or slot TTL) that the few Redis calls a test makes inside it fit in even on a loaded machine; the test
# then sleeps past it, and a sleep only ever runs long.
SHORT_MS = 2000
QUOTA = dict(requests_per_minute=5, tokens_per_minute=1000, monthly_tokens=10_000, max_concurrent_requests=3,
             default_max_tokens=50, max_tokens_limit=200, max_adapters=1, max_adapter_storage_bytes=1)


def tenant(tenant_id: int = 1, **overrides) -> TenantInfo:
    return TenantInfo(id=tenant_id, slug=f"t{tenant_id}", quota=EffectiveQuota(**{**QUOTA, **overrides}))


async def _zero(tenant_id, start, end) -> int:
    return 0


def run(scenario, **limiter_kwargs):
    """Run `scenario(limiter, redis)` on a fresh event loop with its own client."""

    async def main():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        limiter = QuotaLimiter(client, month_usage=limiter_kwargs.pop("month_usage", _zero), **limiter_kwargs)
        try:
            return await scenario(limiter, client)
        finally:
            await client.aclose()

    return async_to_sync(main)()


async def state(limiter: QuotaLimiter, client, tenant_id: int, month: str) -> dict:
    keys = limiter.keys(tenant_id, month)
    costs = {k.decode(): int(v) for k, v in (await client.hgetall(keys["costs"])).items()}
    return {
        "requests": await client.zcard(keys["window"]),
        "tokens": int(await client.get(keys["tokens"]) or 0),
        "costs": costs,
        "slots": await client.zcard(keys["slots"]),
        "month": int((await client.hget(keys["month"], "used")) or 0),
    }


def test_reserve_counts_requests_tokens_slots_and_month_exactly(redis_db):
    async def scenario(limiter, client):
        first = await limiter.reserve(tenant(), "key1", 30, 20)
        second = await limiter.reserve(tenant(), "key1", 10, None)  # default_max_tokens = 50
        return first, second, await state(limiter, client, 1, first.month)

    first, second, s = run(scenario)
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    assert (first.reserved_tokens, first.max_tokens) == (50, 20)
    assert (second.reserved_tokens, second.max_tokens) == (60, 50)
    assert s == {"requests": 2, "tokens": 110, "costs": {first.id: 50, second.id: 60}, "slots": 2, "month": 110}
    assert second.headers["x-ratelimit-remaining-requests"] == "3"
    assert second.headers["x-ratelimit-remaining-tokens"] == str(1000 - 110)
    assert second.headers["x-ratelimit-limit-tokens"] == "1000"


def test_settle_and_release_correct_every_counter_once(redis_db):
    async def scenario(limiter, client):
        a = await limiter.reserve(tenant(), "k", 40, 100)  # 140 reserved
        b = await limiter.reserve(tenant(), "k", 10, 100)  # 110 reserved
        settled = await limiter.settle(a, 40, 7)  # 47 real
        released = await limiter.release(b)  # 0 real
        again = (await limiter.settle(a, 40, 100), await limiter.release(a), await limiter.settle(b, 1, 1))
        return a, b, settled, released, again, await state(limiter, client, 1, a.month)

    a, b, settled, released, again, s = run(scenario)
    assert (settled, released, again) == (True, True, (False, False, False))
    assert s == {"requests": 2, "tokens": 47, "costs": {a.id: 47, b.id: 0}, "slots": 0, "month": 47}


def test_each_limit_refuses_with_its_reason_and_retry_after(redis_db):
    async def scenario(limiter, client):
        out = {}
        for _ in range(3):
            await limiter.reserve(tenant(1), "k", 1, 1)
        out["concurrency"] = await limiter.reserve(tenant(1), "k", 1, 1)
        for _ in range(5):
            r = await limiter.reserve(tenant(2, max_concurrent_requests=100), "k", 1, 1)
            await limiter.settle(r, 1, 1)
        out["requests"] = await limiter.reserve(tenant(2, max_concurrent_requests=100), "k", 1, 1)
        await limiter.reserve(tenant(3), "k", 900, 50)
        out["tokens"] = await limiter.reserve(tenant(3), "k", 100, 50)
        await limiter.reserve(tenant(4, monthly_tokens=300), "k", 100, 100)
        out["monthly"] = await limiter.reserve(tenant(4, monthly_tokens=300), "k", 100, 100)
        return out

    out = run(scenario)
    assert all(isinstance(refusal, Refusal) for refusal in out.values())
    assert out["concurrency"].reason == "max_concurrent_requests"
    assert out["concurrency"].retry_after_s == 1.0
    assert out["requests"].reason == "requests_per_minute"
    assert out["requests"].headers["x-ratelimit-remaining-requests"] == "0"
    assert 55 < out["requests"].retry_after_s <= 60  # the oldest of 5 entries leaves the 60 s window
    assert out["tokens"].reason == "tokens_per_minute"
    assert 55 < out["tokens"].retry_after_s <= 60
    assert out["tokens"].headers["x-ratelimit-remaining-tokens"] == "50"
    assert out["monthly"].reason == "monthly_tokens"
    _, next_month = month_bounds(datetime.now(UTC))
    assert 0 < out["monthly"].retry_after_s <= (next_month - datetime.now(UTC)).total_seconds() + 1
    for refusal in out.values():
        assert int(refusal.headers["retry-after"]) >= refusal.retry_after_s
        assert int(refusal.headers["retry-after-ms"]) == round(refusal.retry_after_s * 1000)


def test_a_refusal_takes_nothing(redis_db):
    async def scenario(limiter, client):
        admitted = await limiter.reserve(tenant(), "k", 900, 50)
        refused = await limiter.reserve(tenant(), "k", 100, 50)
        return admitted, refused, await state(limiter, client, 1, admitted.month)

    admitted, refused, s = run(scenario)
    assert isinstance(refused, Refusal)
    assert s == {"requests": 1, "tokens": 950, "costs": {admitted.id: 950}, "slots": 1, "month": 950}


def test_peek_reports_the_window_without_taking_anything(redis_db):
    async def scenario(limiter, client):
        empty = await limiter.peek(tenant())
        admitted = await limiter.reserve(tenant(), "k", 30, 20)
        before = await state(limiter, client, 1, admitted.month)
        seen = await limiter.peek(tenant())
        return empty, admitted, seen, before, await state(limiter, client, 1, admitted.month)

    empty, admitted, seen, before, after = run(scenario)
    assert empty["x-ratelimit-remaining-requests"] == "5" and empty["x-ratelimit-remaining-tokens"] == "1000"
    assert empty["x-ratelimit-reset-requests"] == "0ms"
    assert seen["x-ratelimit-remaining-requests"] == admitted.headers["x-ratelimit-remaining-requests"] == "4"
    assert seen["x-ratelimit-remaining-tokens"] == "950"
    assert before == after


def test_peek_forgets_what_left_the_window(redis_db):
    async def scenario(limiter, client):
        await limiter.reserve(tenant(), "k", 100, 100)
        await asyncio.sleep(0.25)
        return await limiter.peek(tenant())

    seen = run(scenario, window_ms=200)
    assert (seen["x-ratelimit-remaining-requests"], seen["x-ratelimit-remaining-tokens"]) == ("5", "1000")


def test_window_frees_requests_and_tokens_after_it_passes(redis_db):
    async def scenario(limiter, client):
        quota = dict(requests_per_minute=3, max_concurrent_requests=100)
        first = [await limiter.reserve(tenant(**quota), "k", 1, 1) for _ in range(4)]
        await asyncio.sleep(SHORT_MS / 1000 + 0.05)
        second = [await limiter.reserve(tenant(**quota), "k", 1, 1) for _ in range(4)]
        return first, second, await state(limiter, client, 1, first[0].month)

    first, second, s = run(scenario, window_ms=SHORT_MS)
    assert [isinstance(r, Reservation) for r in first] == [True, True, True, False]
    assert [isinstance(r, Reservation) for r in second] == [True, True, True, False]
    assert s["requests"] == 3 and s["tokens"] == 6 and len(s["costs"]) == 3  # the old entries are gone
    assert s["month"] == 12  # the month keeps everything


def test_slot_of_a_request_that_never_settles_expires(redis_db):
    async def scenario(limiter, client):
        quota = dict(max_concurrent_requests=1)
        held = await limiter.reserve(tenant(**quota), "k", 1, 1)
        blocked = await limiter.reserve(tenant(**quota), "k", 1, 1)
        await asyncio.sleep(SHORT_MS / 1000 + 0.05)
        after = await limiter.reserve(tenant(**quota), "k", 1, 1)
        return held, blocked, after

    held, blocked, after = run(scenario, slot_ttl_ms=SHORT_MS)
    assert isinstance(held, Reservation) and isinstance(after, Reservation)
    assert isinstance(blocked, Refusal) and blocked.reason == "max_concurrent_requests"


def test_lost_month_counter_is_rebuilt_from_the_loader_once(redis_db):
    calls = []

    async def loader(tenant_id, start, end):
        calls.append((tenant_id, start, end))
        return 9_950

    async def scenario(limiter, client):
        a = await limiter.reserve(tenant(), "k", 20, 20)  # 9950 + 40 = 9990 <= 10000
        b = await limiter.reserve(tenant(), "k", 20, 20)  # would be 10030: refused
        return a, b, await state(limiter, client, 1, a.month)

    a, b, s = run(scenario, month_usage=loader)
    assert isinstance(a, Reservation) and isinstance(b, Refusal) and b.reason == "monthly_tokens"
    assert s["month"] == 9_990
    assert len(calls) == 1 and calls[0][0] == 1 and calls[0][1].day == 1 and calls[0][2] > calls[0][1]


def test_settle_after_a_rebuild_adds_the_real_tokens_whole(redis_db):
    async def scenario(limiter, client):
        a = await limiter.reserve(tenant(), "k", 10, 90)  # 100 reserved under the first counter
        await client.delete(limiter.keys(1, a.month)["month"])  # Redis lost the month
        await limiter.rebuild_month(1, *month_bounds(datetime.now(UTC)))
        await limiter.settle(a, 10, 5)
        return await state(limiter, client, 1, a.month)

    assert run(scenario)["month"] == 15  # loader said 0; the request's 15 real tokens are added, not -85


def test_requests_that_can_never_fit_are_value_errors(redis_db):
    async def scenario(limiter, client):
        errors = []
        for args in ((10, 500), (900, 200), (-1, 10)):
            try:
                await limiter.reserve(tenant(), "k", *args)
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    errors = run(scenario)
    assert len(errors) == 3
    assert "exceeds this tenant's limit of 200" in errors[0]
    assert "tokens_per_minute limit of 1000" in errors[1]
    assert "prompt_tokens must be" in errors[2]


@pytest.mark.parametrize(("ms", "text"),
                         [(0, "0ms"), (250, "250ms"), (1500, "1.5s"), (60_000, "1m0s"), (61_250, "1m1.25s")])
def test_format_duration(ms, text):
    assert format_duration(ms) == text


@pytest.mark.django_db
def test_module_functions_queue_a_burst_larger_than_the_pool(redis_db, settings):
    from tenants import limiter

    settings.REDIS_POOL_SIZE = 4

    async def main():
        outcomes = await asyncio.gather(*(limiter.reserve(tenant(7, max_concurrent_requests=100,
                                                                requests_per_minute=100), "k", 1, 1)
                                          for _ in range(60)))
        admitted = [o for o in outcomes if isinstance(o, Reservation)]
        closed = await asyncio.gather(*(limiter.settle(r, 1, 0) for r in admitted[:30]),
                                      *(limiter.release(r) for r in admitted[30:]))
        return len(admitted), closed

    num_admitted, closed = async_to_sync(main)()
    assert num_admitted == 60 and all(closed)


def test_a_held_slot_outlives_its_ttl_until_it_is_settled(redis_db):
    ttl_ms = SHORT_MS  # renewed every third of it: a stall of two thirds would let it lapse

    async def scenario(limiter, client):
        quota = dict(max_concurrent_requests=1)
        held = await limiter.reserve(tenant(**quota), "k", 1, 1)
        holding = asyncio.ensure_future(limiter.hold(held))
        refusals, deadline = [], time.monotonic() + 3 * ttl_ms / 1000  # three TTLs of a request still running
        while time.monotonic() < deadline:
            refusals.append(await limiter.reserve(tenant(**quota), "k", 1, 1))
            await asyncio.sleep(0.2)
        await limiter.settle(held, 1, 1)
        await asyncio.wait_for(holding, timeout=30)  # ends by itself once the slot is gone
        return refusals, await limiter.reserve(tenant(**quota), "k", 1, 1)

    refusals, after = run(scenario, slot_ttl_ms=ttl_ms)
    assert len(refusals) >= 10 and {r.reason for r in refusals if isinstance(r, Refusal)} == {
        "max_concurrent_requests"}
    assert all(isinstance(r, Refusal) for r in refusals)
    assert isinstance(after, Reservation)  # the settled slot was not renewed back
