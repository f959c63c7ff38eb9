"""One `redis.asyncio` client per event loop of a process, for the limiter and the key cache.

- Its pool blocks (up to POOL_TIMEOUT_S) when all settings.REDIS_POOL_SIZE connections are busy, instead of
  failing a burst of requests with "Too many connections" as redis-py's default pool does.
- A command that finds its pooled connection dead (Redis restarted since: "Connection closed by server") is sent
  again on a new connection, twice at most, instead of failing its request. Only connection errors are retried:
  such a command never reached the Redis that answers now. A timeout is not retried (the command may have run);
  every script the gateway sends is safe to repeat anyway (a reservation id is admitted once, a settle closes
  once).
- settings.REDIS_TIMEOUT_S bounds connecting and each reply, so a frozen Redis costs a request that long, then
  its 503 (gateway.views), never a hung request.
"""

import asyncio
import weakref

POOL_TIMEOUT_S = 5
COMMAND_RETRIES = 2

_clients = weakref.WeakKeyDictionary()


def loop_redis():
    """This event loop's client over settings.REDIS_URL (redis.asyncio connections belong to one loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        import redis.asyncio as aioredis
        from django.conf import settings
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError

        retry = Retry(ExponentialBackoff(cap=0.2, base=0.01), COMMAND_RETRIES, supported_errors=(ConnectionError,))
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=settings.REDIS_POOL_SIZE, timeout=POOL_TIMEOUT_S, retry=retry,
            socket_timeout=settings.REDIS_TIMEOUT_S, socket_connect_timeout=settings.REDIS_TIMEOUT_S)
        client = _clients[loop] = aioredis.Redis(connection_pool=pool)
    return client

