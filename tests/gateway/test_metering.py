"""Exactly one settle and one usage row per request, written even when the coroutine awaiting it is cancelled."""

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync

from gateway.callers import Caller
from gateway.metering import Meter
from gateway.targets import Target
from tenants import services
from tenants.identity import TenantInfo
from tenants.limiter import QuotaLimiter, Refusal, Reservation, reserve
from tenants.models import UsageRecord
from tenants.selectors import quota_effective
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


def caller_of(tenant, *, playground=False) -> Caller:
    info = TenantInfo(id=tenant.pk, slug=tenant.slug, quota=quota_effective(tenant=tenant))
    return Caller(tenant=info, key_id=None, adapter_names=frozenset(), playground=playground)


async def open_meter(caller: Caller, request_id: str) -> Meter:
    reservation = await reserve(caller.tenant, None, 10, 20)
    return Meter(request_id=request_id, caller=caller, target=Target("tiny", "tiny", None), reservation=reservation,
                 started_at=0.0)


async def slots_in_use(tenant_id: int) -> int:
    from tenants.redis_client import loop_redis

    return await loop_redis().zcard(QuotaLimiter.keys(tenant_id, "")["slots"])


def test_concurrent_finishes_settle_and_write_once():
    caller = caller_of(TenantFactory())

    async def scenario():
        meter = await open_meter(caller, "req-once")
        before = await slots_in_use(caller.tenant.id)
        meter.observe({"prompt_tokens": 10, "completion_tokens": 4})
        await asyncio.gather(meter.finish("ok"), meter.finish("error"), meter.finish("cancelled"))
        return before, await slots_in_use(caller.tenant.id)

    before, after = async_to_sync(scenario)()
    assert (before, after) == (1, 0)
    rows = list(UsageRecord.objects.filter(tenant_id=caller.tenant.id).values_list(
        "request_id", "status", "prompt_tokens", "completion_tokens", "playground"))
    assert rows == [("req-once", "ok", 10, 4, False)]


def test_settle_returns_once_the_quota_is_corrected_and_the_row_follows():
    caller = caller_of(TenantFactory())

    async def scenario():
        meter = await open_meter(caller, "req-settle")
        meter.observe({"prompt_tokens": 10, "completion_tokens": 2})
        await meter.settle("ok")
        slots = await slots_in_use(caller.tenant.id)
        await meter.finish("error")  # waits for the row; the first status stands
        return slots

    assert async_to_sync(scenario)() == 0
    assert UsageRecord.objects.get(request_id="req-settle").status == "ok"


def test_the_record_is_written_even_when_the_streaming_coroutine_is_cancelled():
    caller = caller_of(TenantFactory(), playground=True)

    async def scenario():
        meter = await open_meter(caller, "req-cut")
        meter.observe({"prompt_tokens": 10, "completion_tokens": 7})
        waiting = asyncio.ensure_future(meter.finish("cancelled"))
        await asyncio.sleep(0)  # the bookkeeping task has started
        waiting.cancel()  # a client disconnect cancels whoever awaits it
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        await meter.finish("ok")  # waits for the first finish's work; its status stands
        return await slots_in_use(caller.tenant.id)

    assert async_to_sync(scenario)() == 0
    row = UsageRecord.objects.get(request_id="req-cut")
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.playground) == ("cancelled", 10, 7, True)


def test_rows_finishing_together_are_written_in_one_group_and_a_bad_row_costs_only_itself(monkeypatch):
    from gateway import metering
    from tenants import services

    tenant = TenantFactory()
    groups = []
    real = services.usage_records_create_async

    async def recording(*, rows):
        groups.append([row["request_id"] for row in rows])
        await real(rows=rows)

    monkeypatch.setattr(metering, "usage_records_create_async", recording)

    def row(request_id, completion_tokens=3):
        return dict(request_id=request_id, tenant_id=tenant.pk, api_key_id=None, adapter="", prompt_tokens=5,
                    completion_tokens=completion_tokens, status="ok", latency_ms=12)

    async def scenario():
        writer = metering.UsageWriter()
        first = asyncio.ensure_future(writer.write(row("g-0")))
        await asyncio.sleep(0)  # the first insert is under way: the next ones wait for it, together
        rest = [writer.write(row(f"g-{i}")) for i in range(1, 5)]
        bad = writer.write(row("g-bad", completion_tokens=-1))
        results = await asyncio.gather(first, *rest, bad, return_exceptions=True)
        return results

    results = async_to_sync(scenario)()
    assert results[:5] == [None] * 5 and isinstance(results[5], ValueError)
    assert groups == [["g-0"], ["g-1", "g-2", "g-3", "g-4", "g-bad"]]  # the second group refused as a whole...
    written = set(UsageRecord.objects.filter(tenant_id=tenant.pk).values_list("request_id", flat=True))
    assert written == {f"g-{i}" for i in range(5)}  # ...then written row by row, all but the bad one


def test_a_request_running_past_the_slot_ttl_keeps_counting_against_concurrency(settings):
    settings.QUOTA_SLOT_TTL_S = 2  # renewed every third of it: a stall of two thirds would let it lapse
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes={"max_concurrent_requests": 1})
    caller = caller_of(tenant)

    async def scenario():
        meter = await open_meter(caller, "req-long")
        refusals, deadline = [], time.monotonic() + 3 * settings.QUOTA_SLOT_TTL_S  # still running 3 TTLs later
        while time.monotonic() < deadline:
            refusals.append(await reserve(caller.tenant, None, 1, 1))
            await asyncio.sleep(0.2)
        meter.observe({"prompt_tokens": 10, "completion_tokens": 3})
        await meter.finish("ok")
        return refusals, await reserve(caller.tenant, None, 1, 1)

    refusals, after = async_to_sync(scenario)()
    assert len(refusals) >= 10
    assert all(isinstance(r, Refusal) and r.reason == "max_concurrent_requests" for r in refusals)
    assert isinstance(after, Reservation)  # the slot came back when the request ended
