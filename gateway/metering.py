"""Exactly one settle and one usage row per admitted request, however it ends (completed, failed, client gone).

The counts are the engine's cumulative usage as last relayed to the client, so a request cut anywhere is billed
for what it produced up to there. The bookkeeping runs in its own task: cancelling the streaming coroutine (a
client disconnect) cannot interrupt it halfway, and a second ``finish`` only waits for the first.

Nothing is dropped when Redis or the database fails, and neither holds back an answer:

- A settle Redis does not take (down, restarting, frozen) is sent again, with backoff, until it does (a settle
  closes its reservation once, so a repeat is harmless): the tenant's slot and the month's count are corrected
  when Redis is back, instead of the slot staying taken until its TTL and the whole reservation staying charged.
- A usage row the database does not take (unreachable, not answering) stays queued, with its own request time,
  and is written when the database is back (the insert ignores a request id already written). A row the
  database refuses for its content is logged and counted, and costs only itself.
- The answer waits for the settle at most SETTLE_WAIT_S (so the client's next request sees its quota corrected)
  and for the usage row at most ROW_WAIT_S (not at all while the database is known to be down); past that both
  go on in the background.

Rows are written in groups (group commit): one writer per event loop inserts, in one statement, every row that
finished while its previous insert ran. A request alone waits for nothing; sixteen streams ending in the same
step cost one INSERT and one commit instead of sixteen.
"""

import asyncio
import logging
import time
import weakref

from django.db import InterfaceError, OperationalError
from django.utils import timezone

from gateway import metrics
from gateway.callers import Caller
from gateway.targets import Target
from tenants.db_thread import on_db_thread
from tenants.limiter import Reservation, hold, settle, until_redis_answers
from tenants.models import UsageStatus
from tenants.services import usage_record_create_async, usage_records_create_async

logger = logging.getLogger("gateway.metering")

SETTLE_WAIT_S = 0.5  # the longest an answer waits for its settle (before [DONE])
ROW_WAIT_S = 2.0  # the longest an answer waits for its usage row (before its end)
RETRY_FIRST_S, RETRY_MAX_S = 0.25, 10.0  # backoff of rows retried after an outage (settles: the limiter's)
MAX_ROWS_PER_INSERT = 500
_DATABASE_DOWN = (OperationalError, InterfaceError)  # tenants.db_thread.DatabaseNotAnswering included

# Strong references to bookkeeping tasks still running (the event loop itself keeps only weak ones).
_running: set[asyncio.Task] = set()


def spawn(coroutine) -> asyncio.Task:
    """Run ``coroutine`` to its end even if nobody awaits it (bookkeeping must not be dropped)."""
    task = asyncio.ensure_future(coroutine)
    _running.add(task)
    task.add_done_callback(_running.discard)
    return task


async def _wait_at_most(futures, timeout: float) -> None:
    """Wait for ``futures`` to be done, at most ``timeout`` seconds; they go on either way (never cancelled)."""
    pending = [f for f in futures if not f.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout)


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
        self._settle_waited = False
        # The concurrency slot outlives its TTL while the request runs (a stream of any length keeps counting).
        self._holding = asyncio.ensure_future(hold(reservation))
        loop = asyncio.get_running_loop()
        self._settled = loop.create_future()  # done after the first settle attempt (taken, or queued again)
        self._written = loop.create_future()  # done once the usage row is written (or refused for good)

    def observe(self, usage: dict | None) -> None:
        """Take the engine's cumulative usage of a chunk relayed to the client."""
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)

    async def finish(self, status: str) -> None:
        """Settle the reservation and write the usage row, once (later calls keep the first status); returns
        when both are done, or after SETTLE_WAIT_S + ROW_WAIT_S at most, with what is left going on in the
        background."""
        self._start(status)
        if not self._settle_waited:
            await _wait_at_most([self._settled], SETTLE_WAIT_S)
        # While the database is known to be down, the row waits in the writer's queue: no use waiting for it.
        if not loop_usage_writer().in_outage:
            await _wait_at_most([self._written], ROW_WAIT_S)

    async def settle(self, status: str) -> None:
        """Start :meth:`finish` and wait only for the settle (a Redis call), at most SETTLE_WAIT_S: the caller can
        then end its answer, with the tenant's slot and tokens already corrected, before the usage row's commit."""
        self._start(status)
        await _wait_at_most([self._settled], SETTLE_WAIT_S)
        self._settle_waited = True  # a finish() that follows waits only for the row

    def _start(self, status: str) -> None:
        if self._task is None:
            self._holding.cancel()
            self._task = spawn(self._record(status, time.monotonic()))

    async def _record(self, status: str, ended_at: float) -> None:
        prompt, completion = self.prompt_tokens, self.completion_tokens
        metrics.outcomes_total.labels(outcome=status).inc()
        metrics.tokens_total.labels(kind="prompt").inc(prompt)
        metrics.tokens_total.labels(kind="completion").inc(completion)
        row = loop_usage_writer().submit(dict(
            request_id=self.request_id, tenant_id=self.caller.tenant.id, api_key_id=self.caller.key_id,
            adapter=self.target.usage_name, prompt_tokens=prompt, completion_tokens=completion, status=status,
            latency_ms=int((ended_at - self.started_at) * 1000), playground=self.caller.playground,
            created_at=timezone.now()))
        row.add_done_callback(self._row_done)
        await settle_until_taken(self.reservation, prompt, completion, self.request_id, self._settled, time.time())

    def _row_done(self, row: asyncio.Future) -> None:
        if not row.cancelled() and row.exception() is not None:
            metrics.usage_write_failures_total.labels(what="usage_row").inc()
            logger.error("usage row of %s (tenant %s) refused: %r", self.request_id, self.caller.tenant.id,
                         row.exception())
        self._written.set_result(None)


# Settles Redis has not taken yet (sent now, or to be sent again): reservation id -> (reservation, prompt tokens,
# completion tokens, request id, when the request ended in epoch seconds).
_unsettled: dict[str, tuple[Reservation, int, int, str, float]] = {}


def unsettled() -> list[tuple[Reservation, int, int, str, float]]:
    """The settles this process still owes Redis (gateway.spool keeps them when the process stops)."""
    return list(_unsettled.values())


async def settle_until_taken(reservation: Reservation, prompt: int, completion: int, request_id: str,
                             first_attempt: asyncio.Future | None, ended_at: float) -> None:
    """Settle, again and again with backoff while Redis does not answer; ``first_attempt`` is done after the
    first try (taken, or queued to be sent again). ``ended_at``: when the request ended (epoch seconds)."""
    queued = False

    def failed(exc: Exception) -> None:
        nonlocal queued
        metrics.usage_write_failures_total.labels(what="settle").inc()
        if not queued:
            queued = True
            metrics.settles_pending.inc()
            logger.warning("settle of %s failed (%r); sent again until Redis takes it", request_id, exc)
        if first_attempt is not None and not first_attempt.done():
            first_attempt.set_result(None)

    _unsettled[reservation.id] = (reservation, prompt, completion, request_id, ended_at)
    try:
        taken = await until_redis_answers(lambda: settle(reservation, prompt, completion, ended_at),
                                          f"settle of {request_id}", on_failure=failed)
        if taken and queued:
            logger.info("settle of %s taken after Redis came back", request_id)
        elif not taken:  # refused for another reason than an outage (the slot's TTL frees it), or given up
            metrics.usage_write_failures_total.labels(what="settle").inc()
    finally:
        _unsettled.pop(reservation.id, None)
        if queued:
            metrics.settles_pending.dec()
        if first_attempt is not None and not first_attempt.done():
            first_attempt.set_result(None)


class UsageWriter:
    """Writes usage rows on the gateway's database thread, grouping those that wait while an insert runs, and
    keeping those the database does not take until it does."""

    def __init__(self, *, retry_first_s: float = RETRY_FIRST_S, retry_max_s: float = RETRY_MAX_S):
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._in_flight: list[tuple[dict, asyncio.Future]] = []
        self._task: asyncio.Task | None = None
        self.in_outage = False  # the last insert failed for want of a database; cleared by the next that works
        self.retry_first_s, self.retry_max_s = retry_first_s, retry_max_s

    @property
    def pending(self) -> int:
        """Rows not yet known to be written."""
        return len(self._pending) + len(self._in_flight)

    def unwritten(self) -> list[dict]:
        """The rows not yet known to be written, the group in an insert now included (gateway.spool keeps them
        when the process stops; writing one twice is harmless)."""
        return [fields for fields, _ in self._in_flight + self._pending]

    def submit(self, fields: dict) -> asyncio.Future:
        """Queue one row (``usage_record_create_async``'s keyword arguments); the future is done once it is
        written, or with the exception of a database that refuses it for good (never for an outage)."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((fields, done))
        metrics.usage_rows_pending.inc()
        if self._task is None or self._task.done():
            self._task = spawn(self._drain())
        return done

    async def write(self, fields: dict) -> None:
        """Write one row and wait for it; raises what a database refusing it raised."""
        await self.submit(fields)

    async def _drain(self) -> None:
        delay = self.retry_first_s
        while self._pending:
            group = self._in_flight = self._pending[:MAX_ROWS_PER_INSERT]
            del self._pending[:MAX_ROWS_PER_INSERT]
            try:
                await on_db_thread(usage_records_create_async, rows=[fields for fields, _ in group])
            except _DATABASE_DOWN as exc:
                self._requeue(group, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
                continue
            except Exception as exc:  # noqa: BLE001 - a row is bad: the others are still written
                if len(group) == 1:
                    self._in_flight = []
                    self._resolve(group[0][1], exc)
                elif not await self._one_by_one(group):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_max_s)
                continue
            self._in_flight = []
            self.in_outage = False
            for _, done in group:
                self._resolve(done)
            delay = self.retry_first_s

    async def _one_by_one(self, group) -> bool:
        """Write each row alone; False when the database went away meanwhile (the rest is queued again)."""
        for index, (fields, done) in enumerate(group):
            try:
                await on_db_thread(usage_record_create_async, **fields)
            except _DATABASE_DOWN as exc:
                self._requeue(group[index:], exc, self.retry_first_s)
                return False
            except Exception as exc:  # noqa: BLE001 - handed to the request waiting on it
                self._resolve(done, exc)
            else:
                self._resolve(done)
        self._in_flight = []
        return True

    def _requeue(self, group, exc: Exception, delay: float) -> None:
        self._in_flight = []
        self.in_outage = True
        self._pending[:0] = group
        metrics.usage_write_failures_total.labels(what="usage_row").inc()
        logger.warning("%d usage row(s) not written (%r); kept and retried in %.2f s", len(self._pending), exc,
                       delay)

    @staticmethod
    def _resolve(done: asyncio.Future, exc: Exception | None = None) -> None:
        metrics.usage_rows_pending.dec()
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)


_writers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, UsageWriter]" = weakref.WeakKeyDictionary()


def loop_usage_writer() -> UsageWriter:
    """This event loop's writer."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = UsageWriter()
    return writer


OK, ERROR, CANCELLED = UsageStatus.OK.value, UsageStatus.ERROR.value, UsageStatus.CANCELLED.value
