"""The gateway's database work (usage rows, key and adapter lookups) on one long-lived thread with a kept-open
connection. It lives in tenants, which the gateway and adapters build on, so that tenants' own gateway-side reads
(API keys, the month's usage) use it without importing the gateway.

Under ASGI, Django gives every request its own thread for the async ORM, and so its own database connection,
opened and closed per request: on PostgreSQL a new server process each time, several milliseconds of CPU on a
small machine, for one INSERT. The gateway's queries instead run on a dedicated thread whose connection stays
open; a connection the server dropped is reopened and the query retried once (the usage insert is idempotent
by request id).

A query that does not answer within settings.GATEWAY_DB_TIMEOUT_S (a frozen or unreachable server: the socket
stays open, and neither the server's statement_timeout nor TCP can end it) raises :class:`DatabaseNotAnswering`,
and the thread it is stuck on is left behind: the next query gets a new thread and a new connection, so one stuck
query does not hold every later one. At most MAX_STUCK_THREADS are left behind at once; past that, queries fail at
once until one of them comes back.
"""

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger("tenants.db_thread")
MAX_STUCK_THREADS = 4


class DatabaseNotAnswering(OperationalError):
    """The database did not answer a gateway query in time (its thread was left behind)."""


def _new_executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-db")


_executor = _new_executor()
_stuck: set[ThreadPoolExecutor] = set()  # executors left behind, their thread still inside a query
_lock = threading.Lock()


def _drop_connection() -> None:
    connection.close()


async def _run(executor: ThreadPoolExecutor, query, kwargs):
    async with ThreadSensitiveContext(executor=executor):
        try:
            return await query(**kwargs)
        except (InterfaceError, OperationalError):
            await sync_to_async(_drop_connection)()
            return await query(**kwargs)


async def on_db_thread(query, /, **kwargs):
    """``await query(**kwargs)`` (an async ORM function) with its ORM calls on the gateway's database thread;
    :class:`DatabaseNotAnswering` when the database does not answer in time."""
    executor = _executor
    if executor in _stuck:
        raise DatabaseNotAnswering(f"the database has not answered for over {settings.GATEWAY_DB_TIMEOUT_S} s")
    try:
        return await asyncio.wait_for(_run(executor, query, kwargs), settings.GATEWAY_DB_TIMEOUT_S)
    except TimeoutError:
        _leave_behind(executor)
        raise DatabaseNotAnswering(
            f"the database did not answer within {settings.GATEWAY_DB_TIMEOUT_S} s") from None


def _leave_behind(executor: ThreadPoolExecutor) -> None:
    """Give up on ``executor``'s thread (stuck in a query): later queries use a new thread, unless too many are
    stuck already, in which case they fail at once until this one comes back."""
    global _executor
    with _lock:
        if executor in _stuck:
            return
        _stuck.add(executor)
        logger.error("the database did not answer within %s s; %d gateway database thread(s) stuck",
                     settings.GATEWAY_DB_TIMEOUT_S, len(_stuck))
        back = executor.submit(_drop_connection)  # runs once the stuck query returns: its connection is suspect
        back.add_done_callback(lambda _: _came_back(executor))
        executor.shutdown(wait=False)
        if executor is _executor and len(_stuck) < MAX_STUCK_THREADS:
            _executor = _new_executor()


def _came_back(executor: ThreadPoolExecutor) -> None:
    global _executor
    with _lock:
        _stuck.discard(executor)
        if _executor in _stuck:  # new threads were refused meanwhile (too many stuck): start one now
            _executor = _new_executor()
    logger.warning("a stuck gateway database thread came back; %d still stuck", len(_stuck))


def close_db_thread_connection() -> None:
    """Close the database thread's connection (tests, before their database is dropped; a thread left behind
    closes its own when its query comes back)."""
    executor = _executor
    if executor not in _stuck:
        executor.submit(_drop_connection).result()
