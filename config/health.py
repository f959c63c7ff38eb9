"""Liveness and readiness of a web process: ``GET /health``.

- ``database`` and ``redis`` must answer within CHECK_TIMEOUT_S: every API call needs both (keys, quotas,
  adapters), so either one failing answers 503 and names it. A database that does not answer at all (frozen, or a
  network that drops packets) costs the check CHECK_TIMEOUT_S, never a hung health check: its query runs on the
  check's own thread, and while that query is still stuck later checks say so at once.
- ``engines``: the engine replicas as the gateway last saw them (ENGINE_URLS; /health and /stats, re-read when
  older than GATEWAY_HEALTH_TTL_MS). Some or all of them down is ``degraded`` with status 200: requests then get
  their own clean error or go to a replica that is up, and every gateway process sees the same engines, so taking
  this one out of a load balancer would not help.

Body: ``{"status": "ok" | "degraded" | "unavailable", "database": "ok" | why, "redis": "ok" | why,
"engines": {"healthy": n, "total": m}}``.
"""

import asyncio
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import JsonResponse

CHECK_TIMEOUT_S = 2.0

_database_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-db")
_database_check: Future | None = None


def _select_one() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        connection.close()  # reconnect at the next check
        raise


async def _database() -> str:
    global _database_check
    if _database_check is not None and not _database_check.done():
        return "not answering: an earlier check's query is still waiting for it"
    _database_check = check = _database_thread.submit(_select_one)
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(check)), CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"not answering within {CHECK_TIMEOUT_S:g} s"
    except DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return "ok"


async def _redis() -> str:
    from redis.exceptions import RedisError

    from tenants.redis_client import loop_redis

    try:
        await asyncio.wait_for(loop_redis().ping(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"not answering within {CHECK_TIMEOUT_S:g} s"
    except (RedisError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return "ok"


async def _engines() -> dict[str, int]:
    if not settings.ENGINE_URLS:
        return {"healthy": 0, "total": 0}
    from gateway.upstream import loop_upstream

    pool = loop_upstream().pool
    try:
        await asyncio.wait_for(pool.candidates(None), CHECK_TIMEOUT_S + 1)
    except TimeoutError:
        pass  # report what is known
    return {"healthy": sum(r.healthy and r.checked_at > float("-inf") for r in pool.replicas),
            "total": len(pool.replicas)}


async def health(request):
    database, redis, engines = await asyncio.gather(_database(), _redis(), _engines())
    if database != "ok" or redis != "ok":
        status = "unavailable"
    elif engines["healthy"] < engines["total"]:
        status = "degraded"
    else:
        status = "ok"
    return JsonResponse({"status": status, "database": database, "redis": redis, "engines": engines},
                        status=503 if status == "unavailable" else 200)


def close_check_connection() -> None:
    """Close the check thread's database connection (tests, before their database is dropped)."""
    _database_thread.submit(_close).result()


def _close() -> None:
    connection.close()  # the calling thread's: run it on the check's thread
