"""Exactly one settle and one usage row per admitted request, however it ends (completed, failed, client gone).

The counts are the engine's cumulative usage as last relayed to the client, so a request cut anywhere is billed
for what it produced up to there. The bookkeeping runs in its own task: cancelling the streaming coroutine (a
client disconnect) cannot interrupt it halfway, and a second ``finish`` only waits for the first.

Rows are written in groups (group commit): one writer per event loop inserts, in one statement, every row that
finished while its previous insert ran. A request alone waits for nothing; sixteen streams ending in the same
step cost one INSERT and one commit instead of sixteen. A group the database refuses is retried row by row, so a
bad row costs only itself.
"""

import asyncio
import logging
import time
import weakref

from gateway import metrics
from gateway.callers import Caller
from gateway.db import on_db_thread
from gateway.targets import Target
from tenants.limiter import Reservation, settle
from tenants.models import UsageStatus
from tenants.services import usage_record_create_async, usage_records_create_async

logger = logging.getLogger("gateway.metering")

# Strong references to bookkeeping tasks still running (the event loop itself keeps only weak ones).
_running: set[asyncio.Task] = set()


def spawn(coroutine) -> asyncio.Task:
    """Run ``coroutine`` to its end even if nobody awaits it (bookkeeping must not be dropped)."""
    task = asyncio.ensure_future(coroutine)
    _running.add(task)
    task.add_done_callback(_running.discard)
    return task


class Meter:
    def __init__(self, *, request_id: str, caller: Caller, target: Target, reservation: Reservation,
                 started_at: float):
        self.request_id = request_id
        self.caller = caller
        self.target = target
        self.reservation = reservation
        self.started_at = started_at
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self._task: asyncio.Task | None = None
        self._settled = asyncio.get_running_loop().create_future()

    def observe(self, usage: dict | None) -> None:
        """Take the engine's cumulative usage of a chunk relayed to the client."""
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)

    async def finish(self, status: str) -> None:
        """Settle the reservation and write the usage row, once; later calls wait for the first one's result."""
        self._start(status)
        await asyncio.shield(self._task)

    async def settle(self, status: str) -> None:
        """Start :meth:`finish` and wait only for the settle (a Redis call): the caller can then end its answer,
        with the tenant's slot and tokens already corrected, before the usage row's commit."""
        self._start(status)
        await asyncio.shield(self._settled)

    def _start(self, status: str) -> None:
        if self._task is None:
            self._task = spawn(self._record(status, time.monotonic()))

    async def _record(self, status: str, ended_at: float) -> None:
        prompt, completion = self.prompt_tokens, self.completion_tokens
        try:
            await settle(self.reservation, prompt, completion)
        except Exception:  # the slot's TTL frees it; the row below is still written
            metrics.usage_write_failures_total.labels(what="settle").inc()
            logger.exception("settle of %s failed", self.request_id)
        finally:
            self._settled.set_result(None)
        try:
            await loop_usage_writer().write(dict(
                request_id=self.request_id, tenant_id=self.caller.tenant.id, api_key_id=self.caller.key_id,
                adapter=self.target.usage_name, prompt_tokens=prompt, completion_tokens=completion, status=status,
                latency_ms=int((ended_at - self.started_at) * 1000), playground=self.caller.playground))
        except Exception:
            metrics.usage_write_failures_total.labels(what="usage_row").inc()
            logger.exception("usage row of %s (tenant %s, %s+%s tokens, %s) not written", self.request_id,
                             self.caller.tenant.id, prompt, completion, status)
        metrics.outcomes_total.labels(outcome=status).inc()
        metrics.tokens_total.labels(kind="prompt").inc(prompt)
        metrics.tokens_total.labels(kind="completion").inc(completion)


class UsageWriter:
    """Writes usage rows on the gateway's database thread, grouping those that wait while an insert runs."""

    def __init__(self):
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    async def write(self, fields: dict) -> None:
        """Write one row (``usage_record_create_async``'s keyword arguments); raises what its insert raised."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((fields, done))
        if self._task is None or self._task.done():
            self._task = spawn(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            try:
                await on_db_thread(usage_records_create_async, rows=[fields for fields, _ in group])
            except Exception as exc:  # noqa: BLE001 - handed to the requests waiting on the group
                if len(group) == 1:
                    group[0][1].set_exception(exc)
                    continue
                for fields, done in group:  # find the bad row: the others are still written
                    try:
                        await on_db_thread(usage_record_create_async, **fields)
                    except Exception as one:  # noqa: BLE001 - handed to the request waiting on it
                        done.set_exception(one)
                    else:
                        done.set_result(None)
            else:
                for _, done in group:
                    done.set_result(None)


_writers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, UsageWriter]" = weakref.WeakKeyDictionary()


def loop_usage_writer() -> UsageWriter:
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = UsageWriter()
    return writer


OK, ERROR, CANCELLED = UsageStatus.OK.value, UsageStatus.ERROR.value, UsageStatus.CANCELLED.value
