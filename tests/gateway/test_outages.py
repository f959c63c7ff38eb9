"""Redis and the database failing under the gateway: nothing metered is lost, no answer is held back, callers get
a 503 they can retry, and the gateway recovers by itself. Each test breaks services of its own (an own Redis, a
proxy in front of PostgreSQL), never the machine's."""

import asyncio
import json
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import OperationalError, connection, connections
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.selectors import adapter_ready_list_async
from devstack.services import free_port
from gateway.asgi import APIApp
from tenants import services
from tenants.db_thread import close_db_thread_connection, on_db_thread
from tenants.limiter import QuotaLimiter, Reservation, reserve, settle
from tenants.models import UsageRecord
from tenants.redis_client import loop_redis
from tests.gateway.test_metering import caller_of, open_meter, slots_in_use
from tests.support.outages import OwnRedis, TcpProxy
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def own_redis(tmp_path, settings):
    server = OwnRedis(tmp_path / "redis")
    settings.REDIS_URL = server.url  # every event loop of the test makes its client from it
    yield server
    server.close()


@pytest.fixture
def db_proxy():
    """The gateway's database thread (and every connection opened from now on) reaches PostgreSQL through a
    proxy; the test's own connection, already open, does not."""
    params = connections.settings["default"]  # the dict every connection of this process reads when it connects
    if not params["ENGINE"].endswith("postgresql"):
        pytest.skip("needs PostgreSQL (the machine's; these tests cut a proxy in front of it)")
    proxy = TcpProxy(int(params.get("PORT") or 5432))
    connection.ensure_connection()  # the test's own connection (its checks, its teardown) stays direct
    old = params["HOST"], params["PORT"]
    close_db_thread_connection()
    params["HOST"], params["PORT"] = "127.0.0.1", str(proxy.port)
    yield proxy
    proxy.restore()
    params["HOST"], params["PORT"] = old
    close_db_thread_connection()
    proxy.close()


async def eventually(check, timeout: float = 30.0):
    """Poll ``check`` (async, returning a truthy value when done) until it holds; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


async def month_used(reservation: Reservation) -> int:
    key = QuotaLimiter.keys(reservation.tenant_id, reservation.month)["month"]
    return int(await loop_redis().hget(key, "used"))


def row_exists(request_id: str):
    return sync_to_async(UsageRecord.objects.filter(request_id=request_id).exists)


# ---------------------------------------------------------------- Redis


def test_a_pooled_connection_left_by_a_redis_restart_costs_no_request(own_redis):
    caller = caller_of(TenantFactory())

    async def scenario():
        first = await reserve(caller.tenant, None, 10, 20)  # the pool now holds a connection
        own_redis.restart()  # empty, and that connection is dead
        second = await reserve(caller.tenant, None, 10, 20)
        return first, second

    first, second = async_to_sync(scenario)()
    assert isinstance(first, Reservation) and isinstance(second, Reservation)


def test_a_settle_redis_does_not_answer_is_sent_again_once_it_does(own_redis):
    caller = caller_of(TenantFactory())

    async def scenario():
        meter = await open_meter(caller, "req-frozen-redis")  # 10 + 20 tokens reserved
        meter.observe({"prompt_tokens": 10, "completion_tokens": 3})
        reserved = await month_used(meter.reservation)
        own_redis.freeze()
        started = time.monotonic()
        await meter.settle("ok")  # what the stream awaits before [DONE]
        settle_wait = time.monotonic() - started
        await meter.finish("ok")
        own_redis.thaw()
        slots_freed = await eventually(lambda: _none_in_use(caller.tenant.id), timeout=20)
        return reserved, settle_wait, slots_freed, await month_used(meter.reservation)

    reserved, settle_wait, slots_freed, used = async_to_sync(scenario)()
    assert reserved == 30
    assert settle_wait < 1.5  # SETTLE_WAIT_S, not the Redis timeout
    assert slots_freed  # the slot came back when Redis did, not after QUOTA_SLOT_TTL_S
    assert used == 13  # the real tokens, not the reservation
    row = UsageRecord.objects.get(request_id="req-frozen-redis")
    assert (row.prompt_tokens, row.completion_tokens, row.status) == (10, 3, "ok")


async def _none_in_use(tenant_id: int) -> bool:
    return await slots_in_use(tenant_id) == 0


def test_a_reserve_whose_answer_a_frozen_redis_kept_holds_nothing_once_redis_is_back(own_redis):
    caller = caller_of(TenantFactory())

    async def scenario():
        first = await reserve(caller.tenant, None, 10, 20)
        await settle(first, 10, 0)
        before = await month_used(first)
        own_redis.freeze()
        with pytest.raises(RedisTimeoutError):  # sent, never answered: Redis runs it when it wakes up
            await reserve(caller.tenant, None, 10, 20)
        own_redis.thaw()
        await asyncio.sleep(0.5)
        freed = await eventually(lambda: _none_in_use(caller.tenant.id), timeout=10)
        return before, freed, await month_used(first)

    before, freed, after = async_to_sync(scenario)()
    assert freed and after == before == 10  # no slot held for QUOTA_SLOT_TTL_S, no tokens charged


def test_requests_in_flight_when_redis_loses_its_data_are_counted_once_in_the_rebuilt_month(own_redis):
    caller = caller_of(TenantFactory())

    async def scenario():
        in_flight = await open_meter(caller, "req-in-flight")  # 30 reserved; Redis then loses everything
        own_redis.restart()
        other = await reserve(caller.tenant, None, 10, 20)  # rebuilds the month from the table (no row yet)
        in_flight.observe({"prompt_tokens": 10, "completion_tokens": 5})
        await in_flight.finish("ok")  # its record is gone: its 15 tokens are not in the rebuilt month
        await settle(other, 10, 1)
        lost_mid_stream = await month_used(other)

        ended_before = await open_meter(caller, "req-ended-before")
        ended_before.observe({"prompt_tokens": 10, "completion_tokens": 2})
        own_redis.freeze()
        await ended_before.finish("ok")  # its row is written; its settle waits for Redis
        own_redis.restart()  # from frozen to empty
        third = await reserve(caller.tenant, None, 10, 20)  # rebuilt from the table, which holds its row now
        await eventually(lambda: _settled_all(), timeout=20)
        await settle(third, 10, 0)
        return lost_mid_stream, await month_used(third)

    lost_mid_stream, later = async_to_sync(scenario)()
    assert lost_mid_stream == 15 + 11
    table = sum(r.prompt_tokens + r.completion_tokens for r in UsageRecord.objects.filter(tenant_id=caller.tenant.id))
    assert table == 15 + 12
    assert later == table + 10  # the settle that came after the rebuild did not count its row a second time


async def _settled_all() -> bool:
    from gateway.metering import unsettled

    return not unsettled()


def call_api(path: str, *, method: str = "GET", key: str, body: dict | None = None) -> tuple[int, dict, dict]:
    """One request to the API app in-process: (status, headers, JSON body)."""

    async def main():
        raw = json.dumps(body).encode() if body is not None else b""
        messages = [{"type": "http.request", "body": raw, "more_body": False}]
        sent = []

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path,
                 "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]}
        await APIApp()(scope, receive, send)
        return sent

    sent = async_to_sync(main)()
    start = sent[0]
    headers = {name.decode().lower(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_redis_down_is_a_503_with_retry_after_not_a_500(settings):
    tenant = TenantFactory()
    _, key = services.api_key_create(tenant=tenant, name="k", scopes=["inference"])
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    for method, path, body in [("GET", "/v1/models", None),
                               ("POST", "/v1/chat/completions",
                                {"model": "x", "messages": [{"role": "user", "content": "hi"}]})]:
        status, headers, answer = call_api(path, method=method, key=key, body=body)
        assert status == 503, (path, answer)
        assert headers["retry-after"] == "1"
        assert answer["error"]["code"] == "service_unavailable"
        assert answer["error"]["type"] == "server_error"


# ---------------------------------------------------------------- the database


def test_usage_rows_the_database_does_not_take_are_kept_and_written_when_it_is_back(db_proxy):
    caller = caller_of(TenantFactory())

    async def scenario():
        meters = [await open_meter(caller, f"req-cut-{i}") for i in range(4)]
        db_proxy.cut()
        for meter in meters:
            meter.observe({"prompt_tokens": 10, "completion_tokens": 5})
        started = time.monotonic()
        await asyncio.gather(*(meter.finish("ok") for meter in meters[:3]))
        finish_wait = time.monotonic() - started
        started = time.monotonic()
        await meters[3].finish("ok")  # the outage is known now: its answer does not wait for the row at all
        later_wait = time.monotonic() - started
        lost_meanwhile = not await row_exists("req-cut-0")()
        db_proxy.restore()
        written = [await eventually(row_exists(f"req-cut-{i}")) for i in range(4)]
        return finish_wait, later_wait, lost_meanwhile, written, await _none_in_use(caller.tenant.id)

    finish_wait, later_wait, missing_meanwhile, written, slots_free = async_to_sync(scenario)()
    assert finish_wait < 3 and later_wait < 0.5 and missing_meanwhile
    assert written == [True] * 4
    assert slots_free
    assert sorted(UsageRecord.objects.filter(tenant_id=caller.tenant.id).values_list("completion_tokens", flat=True)) \
        == [5] * 4


def test_a_month_rebuild_against_a_frozen_database_fails_in_bounded_time(db_proxy, settings):
    settings.GATEWAY_DB_TIMEOUT_S = 1
    caller = caller_of(TenantFactory())

    async def scenario():
        first = await reserve(caller.tenant, None, 10, 20)
        await settle(first, 10, 0)
        await loop_redis().delete(QuotaLimiter.keys(caller.tenant.id, first.month)["month"])  # evicted, say
        db_proxy.freeze()
        started = time.monotonic()
        with pytest.raises(OperationalError):  # the API's 503 (gateway.errors.outage_error)
            await asyncio.wait_for(reserve(caller.tenant, None, 10, 20), 15)
        took = time.monotonic() - started
        db_proxy.restore()
        return took, await eventually(lambda: _reserves(caller))

    took, works = async_to_sync(scenario)()
    assert took < 2.5 and works


async def _reserves(caller) -> bool:
    try:
        return isinstance(await reserve(caller.tenant, None, 1, 1), Reservation)
    except OperationalError:
        return False


def test_a_frozen_database_holds_back_no_answer_and_no_later_query(db_proxy, settings):
    settings.GATEWAY_DB_TIMEOUT_S = 1
    caller = caller_of(TenantFactory())

    async def scenario():
        meter = await open_meter(caller, "req-frozen-db")
        meter.observe({"prompt_tokens": 10, "completion_tokens": 4})
        db_proxy.freeze()
        started = time.monotonic()
        await meter.finish("ok")  # what the relay awaits before the answer ends
        finish_wait = time.monotonic() - started
        started = time.monotonic()
        with pytest.raises(OperationalError):  # a lookup behind the stuck insert: refused in time, not queued
            await asyncio.wait_for(on_db_thread(adapter_ready_list_async, tenant_id=caller.tenant.id), 15)
        lookup_wait = time.monotonic() - started
        db_proxy.restore()
        written = await eventually(row_exists("req-frozen-db"))
        adapters = await eventually(lambda: _lookup_works(caller.tenant.id))
        return finish_wait, lookup_wait, written, adapters

    finish_wait, lookup_wait, written, lookup_works = async_to_sync(scenario)()
    assert finish_wait < 3  # ROW_WAIT_S
    assert lookup_wait < 2.5  # GATEWAY_DB_TIMEOUT_S
    assert written and lookup_works
    row = UsageRecord.objects.get(request_id="req-frozen-db")
    assert (row.prompt_tokens, row.completion_tokens) == (10, 4)


async def _lookup_works(tenant_id: int) -> bool:
    try:
        await on_db_thread(adapter_ready_list_async, tenant_id=tenant_id)
    except OperationalError:
        return False
    return True
