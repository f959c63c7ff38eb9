"""A gateway process stopping while the database or Redis is down keeps what it owes them on disk (through the
ASGI lifespan's shutdown), and the next process to start hands it over: no usage row, no settle lost."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync

from gateway import spool
from tenants.models import UsageRecord
from tests.gateway.test_metering import caller_of, open_meter, slots_in_use
from tests.gateway.test_outages import db_proxy, eventually, month_used, own_redis  # noqa: F401 - fixtures
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def spool_dir(settings, tmp_path, monkeypatch):
    settings.GATEWAY_SPOOL_DIR = str(tmp_path / "spool")
    monkeypatch.setattr(spool, "SHUTDOWN_WAIT_S", 0.5)
    return tmp_path / "spool"


class Lifespan:
    """The server's side of the ASGI lifespan protocol, driving gateway.spool.lifespan in the running loop."""

    def __init__(self):
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.sent: list[str] = []
        self.task = asyncio.ensure_future(spool.lifespan(self.incoming.get, self._send))

    async def _send(self, message):
        self.sent.append(message["type"])

    async def startup(self):
        await self.incoming.put({"type": "lifespan.startup"})
        await eventually(self._said("lifespan.startup.complete"), timeout=5)

    async def shutdown(self):
        await self.incoming.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self.task, 30)

    def _said(self, what):
        async def check():
            return what in self.sent
        return check


def test_rows_the_database_did_not_take_before_shutdown_are_written_by_the_next_start(db_proxy, spool_dir):  # noqa: F811
    caller = caller_of(TenantFactory())

    async def first_process():
        server = Lifespan()
        await server.startup()
        meters = [await open_meter(caller, f"req-spooled-{i}") for i in range(2)]
        db_proxy.cut()
        for i, meter in enumerate(meters):
            meter.observe({"prompt_tokens": 10, "completion_tokens": 1 + i})
        await asyncio.gather(*(meter.finish("ok") for meter in meters))
        await server.shutdown()
        return server.sent

    sent = async_to_sync(first_process)()
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    files = list(spool_dir.glob("*.jsonl"))
    assert len(files) == 1
    kept = [json.loads(line)["usage_row"]["request_id"] for line in files[0].read_text().splitlines()]
    assert sorted(kept) == ["req-spooled-0", "req-spooled-1"]
    assert not UsageRecord.objects.filter(tenant_id=caller.tenant.id).exists()

    db_proxy.restore()

    async def next_process():
        server = Lifespan()
        await server.startup()  # replays in the background
        await eventually(lambda: _gone(spool_dir))
        await server.shutdown()

    async_to_sync(next_process)()
    rows = UsageRecord.objects.filter(tenant_id=caller.tenant.id).order_by("request_id")
    assert [(r.request_id, r.completion_tokens) for r in rows] == [("req-spooled-0", 1), ("req-spooled-1", 2)]
    assert not list(spool_dir.glob("*"))


async def _gone(directory) -> bool:
    return not list(directory.glob("*.jsonl"))


def test_a_settle_redis_did_not_take_before_shutdown_is_settled_by_the_next_start(own_redis, spool_dir):  # noqa: F811
    caller = caller_of(TenantFactory())

    async def first_process():
        server = Lifespan()
        await server.startup()
        meter = await open_meter(caller, "req-spooled-settle")  # 30 tokens reserved
        meter.observe({"prompt_tokens": 10, "completion_tokens": 2})
        own_redis.freeze()
        await meter.finish("ok")
        await server.shutdown()
        return meter.reservation

    reservation = async_to_sync(first_process)()
    (kept,) = [json.loads(line) for line in next(spool_dir.glob("*.jsonl")).read_text().splitlines()]
    assert kept["settle"]["reservation"]["id"] == reservation.id
    own_redis.thaw()

    async def next_process():
        server = Lifespan()
        await server.startup()
        await eventually(lambda: _gone(spool_dir))
        await server.shutdown()
        return await slots_in_use(caller.tenant.id), await month_used(reservation)

    assert async_to_sync(next_process)() == (0, 12)
    assert UsageRecord.objects.get(request_id="req-spooled-settle").completion_tokens == 2
