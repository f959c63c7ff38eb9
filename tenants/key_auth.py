"""API key authentication for the gateway: async, cached per process, revoked everywhere at once.

Every change that can invalidate a cached key (revocation, suspension, reactivation, a quota change) writes a new
random value to the Redis key AUTH_GENERATION_KEY after its transaction commits (`auth_generation_bump`). Each
lookup reads that value first (one GET) and drops the whole local cache when it changed, so the next request in
any process after the commit sees the change. A random value, not a counter: a Redis that lost its data and
counts again from 1 cannot look unchanged to a process holding an old "1".

    result = await authenticate_api_key(raw_key)            # scope "inference" by default
    if isinstance(result, AuthFailure):                      # result.status is 401 or 403, result.message says why
        ...
    key_info.tenant.quota, key_info.allows_adapter(name)     # see tenants.identity.KeyInfo

`cached_api_key(raw_key)` is the same answer from the local cache without the Redis read, or None: provisional,
for work that may start while `authenticate_api_key` confirms it (the gateway counts the prompt meanwhile).
"""

import asyncio
import hashlib
import logging
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.utils import timezone

from tenants.db_thread import on_db_thread  # the gateway's database thread, with its timeout
from tenants.identity import AuthFailure, KeyInfo
from tenants.redis_client import loop_redis

logger = logging.getLogger("tenants.key_auth")
AUTH_GENERATION_KEY = "tenants:auth:generation"
LAST_USED_EVERY_S = 60.0  # write last_used_at at most this often per key and process
MAX_RAW_KEY_LENGTH = 200


@dataclass(slots=True)
class _Entry:
    result: KeyInfo | AuthFailure
    loaded_at: float


class KeyAuthenticator:
    """A per-process cache of key lookups in front of the database, over one `redis.asyncio.Redis` client."""

    def __init__(self, redis, *, ttl_s: float = 60.0, max_entries: int = 10_000, clock=time.monotonic,
                 run_query=None):
        self.redis = redis
        # Runs each database query: ``await run_query(async_orm_function, **kwargs)``.
        self.run_query = run_query or _reconnecting
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # sha256 of the raw key -> result, LRU order
        self._generation: bytes | None = None
        self._last_used_written: dict[str, float] = {}
        self._loading: dict[str, asyncio.Future] = {}  # sha256 of the raw key -> its lookup in progress
        self.num_db_lookups = 0

    async def authenticate(self, raw_key: str | None, *, scope: str | None = "inference") -> KeyInfo | AuthFailure:
        failure = _shape_failure(raw_key)
        if failure is not None:
            return failure
        await self._follow_generation()
        digest = hashlib.sha256(raw_key.encode()).hexdigest()
        entry = self._entries.get(digest)
        now = self.clock()
        if entry is None or now - entry.loaded_at > self.ttl_s:
            entry = _Entry(await self._load_once(digest, raw_key), now)
            self._remember(digest, entry)
        else:
            self._entries.move_to_end(digest)
        result = entry.result
        if isinstance(result, AuthFailure):
            return result
        if result.expires_at is not None and result.expires_at <= timezone.now():
            return AuthFailure.of("expired")
        if scope is not None and not result.has_scope(scope):
            return AuthFailure.of("scope", scope)
        await self._touch(result.key_id, now)
        return result

    def cached(self, raw_key: str | None, *, scope: str | None = "inference") -> KeyInfo | None:
        """The key's KeyInfo as this process last confirmed it, without any I/O; None when it is not cached (or
        stale, failing, expired, lacking ``scope``). Provisional: a change committed elsewhere shows only in
        :meth:`authenticate`, which must confirm it before anything is reserved or answered on its strength."""
        if self._generation is None or _shape_failure(raw_key) is not None:
            return None
        entry = self._entries.get(hashlib.sha256(raw_key.encode()).hexdigest())
        if entry is None or self.clock() - entry.loaded_at > self.ttl_s or not isinstance(entry.result, KeyInfo):
            return None
        result = entry.result
        if result.expires_at is not None and result.expires_at <= timezone.now():
            return None
        return result if scope is None or result.has_scope(scope) else None

    async def _follow_generation(self) -> None:
        generation = await self.redis.get(AUTH_GENERATION_KEY)
        if generation is None:  # never set, or Redis lost it: start one (all processes converge on the first)
            await self.redis.set(AUTH_GENERATION_KEY, uuid.uuid4().hex, nx=True)
            generation = await self.redis.get(AUTH_GENERATION_KEY)
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation

    async def _load_once(self, digest: str, raw_key: str) -> KeyInfo | AuthFailure:
        """One database lookup however many requests with this key arrive while it runs (a burst of a new key
        would otherwise open one database connection per request)."""
        pending = self._loading.get(digest)
        if pending is None:
            pending = self._loading[digest] = asyncio.ensure_future(self._load(raw_key))
            pending.add_done_callback(lambda _: self._loading.pop(digest, None))
        return await asyncio.shield(pending)  # a cancelled request must not cancel the others' lookup

    async def _load(self, raw_key: str) -> KeyInfo | AuthFailure:
        from tenants.selectors import api_key_lookup_async

        self.num_db_lookups += 1
        return await self.run_query(api_key_lookup_async, raw_key=raw_key)

    def _remember(self, digest: str, entry: _Entry) -> None:
        self._entries[digest] = entry
        self._entries.move_to_end(digest)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def _touch(self, key_id: str, now: float) -> None:
        if now - self._last_used_written.get(key_id, -LAST_USED_EVERY_S) < LAST_USED_EVERY_S:
            return
        self._last_used_written[key_id] = now
        from tenants.services import api_key_mark_used_async

        try:
            await self.run_query(api_key_mark_used_async, prefix=key_id)
        except DatabaseError as exc:  # a bookkeeping write: the request it rides on goes on without it
            logger.warning("last_used_at of key %s not written: %r", key_id, exc)


async def _reconnecting(query, /, *args, **kwargs):
    """``await query(...)``, once more on a new connection if the server dropped the one it used. The gateway's
    API calls run outside Django's request cycle, whose end would otherwise close a broken connection."""
    try:
        return await query(*args, **kwargs)
    except (InterfaceError, OperationalError):
        await sync_to_async(_close_connection)()
        return await query(*args, **kwargs)


def _close_connection() -> None:
    # `connection` resolves to the calling thread's connection: look it up on the ORM thread, where the broken one
    # lives (`sync_to_async(connection.close)` would take the event loop thread's, which Django refuses to close
    # from another thread, and the broken connection would stay for good).
    connection.close()


def _shape_failure(raw_key: str | None) -> AuthFailure | None:
    if not raw_key:
        return AuthFailure.of("missing")
    prefix, dot, secret = raw_key.partition(".")
    if not dot or not prefix or not secret or len(raw_key) > MAX_RAW_KEY_LENGTH or not raw_key.isascii():
        return AuthFailure.of("malformed")
    return None


def auth_generation_bump() -> None:
    """Invalidate every process's cached key lookups (call after the commit that changed a key or tenant)."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.set(AUTH_GENERATION_KEY, uuid.uuid4().hex)
    finally:
        client.close()


# ---------------------------------------------------------------- one authenticator per event loop of a process

_authenticators: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeyAuthenticator]" = weakref.WeakKeyDictionary()


def default_authenticator() -> KeyAuthenticator:
    loop = asyncio.get_running_loop()
    authenticator = _authenticators.get(loop)
    if authenticator is None:
        from django.conf import settings

        authenticator = KeyAuthenticator(loop_redis(), ttl_s=settings.API_KEY_CACHE_TTL_S, run_query=on_db_thread)
        _authenticators[loop] = authenticator
    return authenticator


def cached_api_key(raw_key: str | None, *, scope: str | None = "inference") -> KeyInfo | None:
    """This process's cached KeyInfo for the key, unconfirmed (see KeyAuthenticator.cached), or None."""
    return default_authenticator().cached(raw_key, scope=scope)


async def authenticate_api_key(raw_key: str | None, *, scope: str | None = "inference") -> KeyInfo | AuthFailure:
    """The key's KeyInfo, or an AuthFailure saying why not (missing, malformed, unknown, revoked, expired,
    suspended tenant, lacking `scope`). Cached per process; changes reach every process on its next call."""
    return await default_authenticator().authenticate(raw_key, scope=scope)
