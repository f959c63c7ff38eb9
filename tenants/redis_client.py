"""One `redis.asyncio` client per event loop of a process, for the limiter and the key cache.

Its pool blocks (up to POOL_TIMEOUT_S) when all settings.REDIS_POOL_SIZE connections are busy, instead of
failing a burst of requests with "Too many connections" as redis-py's default pool does.
"""

import asyncio
import weakref

POOL_TIMEOUT_S = 5

_clients = weakref.WeakKeyDictionary()


def loop_redis():
    """This event loop's client over settings.REDIS_URL (redis.asyncio connections belong to one loop)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        import redis.asyncio as aioredis
        from django.conf import settings

        pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=settings.REDIS_POOL_SIZE,
                                                        timeout=POOL_TIMEOUT_S)
        client = _clients[loop] = aioredis.Redis(connection_pool=pool)
    return client
