"""Quota enforcement for the gateway: async `reserve` / `settle` / `release`, exact across processes.

One Lua script per step runs atomically in Redis (`limits` hits each limit on its own, so a request refused by
one limit would still use up the others; here all four are checked and taken together, and settle can refund).

- Requests and tokens per minute: an exact sliding log over the last `window_ms` (Redis server time, so
  processes and hosts agree). Each admitted request is one entry carrying its token cost.
- Concurrency: one slot per open reservation, expiring after `slot_ttl_ms` so a dead request cannot leak it; a
  request that runs longer keeps its slot with `hold` (renewed every third of the TTL until it is settled).
- Monthly tokens (UTC calendar month): a counter of settled tokens plus open reservations. When Redis has lost
  it, it is rebuilt from the usage table (`month_usage`) by exactly one process.

Usage by the gateway, per request::

    outcome = await reserve(key_info.tenant, key_info.key_id, prompt_tokens, body.get("max_tokens"))
    if isinstance(outcome, Refusal):            # 429, outcome.headers carry Retry-After and x-ratelimit-*
        ...
    try:
        ...                                     # call the engine with max_tokens=outcome.max_tokens
    except Exception:
        await release(outcome)                  # nothing was produced: refund the tokens, free the slot
        raise
    await settle(outcome, prompt_tokens=..., completion_tokens=...)   # then write the usage row

`reserve` raises ValueError (answer 400) when the request can never fit: max_tokens above the tenant's limit,
or prompt + max_tokens above the per-minute or monthly token limit.
"""

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tenants.db_thread import on_db_thread
from tenants.identity import TenantInfo
from tenants.redis_client import loop_redis

logger = logging.getLogger("tenants.limiter")
_LUA = Path(__file__).with_name("lua")
MONTH_KEY_TTL_S = 40 * 86400  # a month counter outlives its month, for late settles

# (tenant_id, month start, next month start) -> tokens recorded in the usage table for that month
MonthUsageLoader = Callable[[int, datetime, datetime], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    tenant_id: int
    key_id: str | None
    month: str  # "YYYY-MM" (UTC) that was charged
    prompt_tokens: int
    max_tokens: int  # the completion budget reserved: send it to the engine
    reserved_tokens: int  # prompt_tokens + max_tokens
    headers: dict[str, str]  # x-ratelimit-* values after admission
    month_gen: str = ""  # the month counter's generation it was charged to (see settle.lua)


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # requests_per_minute | tokens_per_minute | max_concurrent_requests | monthly_tokens
    retry_after_s: float
    message: str
    headers: dict[str, str]  # retry-after, retry-after-ms and x-ratelimit-*


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month holding `moment`: [start, next start)."""
    start = moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        return start, start.replace(year=start.year + 1, month=1)
    return start, start.replace(month=start.month + 1)


def format_duration(ms: int) -> str:
    """OpenAI's style for x-ratelimit-reset-*: "250ms", "1.5s", "6m0s"."""
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest_ms = divmod(ms, 60_000)
    seconds = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


class QuotaLimiter:
    """The primitives over one `redis.asyncio.Redis` client (bound to one event loop)."""

    def __init__(self, redis, *, window_ms: int = 60_000, slot_ttl_ms: int = 600_000,
                 record_ttl_ms: int = 86_400_000, concurrency_retry_ms: int = 1000, tombstone_ttl_ms: int = 600_000,
                 month_usage: MonthUsageLoader | None = None, clock: Callable[[], float] = time.time):
        if min(window_ms, slot_ttl_ms, record_ttl_ms, concurrency_retry_ms, tombstone_ttl_ms) < 1:
            raise ValueError("limiter durations must be positive milliseconds")
        self.redis = redis
        self.window_ms, self.slot_ttl_ms, self.record_ttl_ms = window_ms, slot_ttl_ms, record_ttl_ms
        self.tombstone_ttl_ms = tombstone_ttl_ms
        self.concurrency_retry_ms = concurrency_retry_ms
        self.month_usage = month_usage or _usage_table_month_tokens
        self.clock = clock
        self._reserve = redis.register_script((_LUA / "reserve.lua").read_text())
        self._settle = redis.register_script((_LUA / "settle.lua").read_text())
        self._rebuild = redis.register_script((_LUA / "rebuild_month.lua").read_text())
        self._peek = redis.register_script((_LUA / "peek.lua").read_text())
        self._renew = redis.register_script((_LUA / "renew.lua").read_text())

    @staticmethod
    def keys(tenant_id: int, month: str, reservation_id: str = "") -> dict[str, str]:
        tag = f"quota:{{t{tenant_id}}}"  # one hash slot per tenant, so the scripts also run on Redis Cluster
        return {"window": f"{tag}:win", "costs": f"{tag}:cost", "tokens": f"{tag}:tok", "slots": f"{tag}:slots",
                "month": f"{tag}:month:{month}", "record": f"{tag}:rsv:{reservation_id}"}

    async def reserve(self, tenant: TenantInfo, key_id: str | None, prompt_tokens: int,
                      max_tokens: int | None) -> Reservation | Refusal:
        quota = tenant.quota
        if not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool) or prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be a non-negative integer, got {prompt_tokens!r}")
        budget = quota.resolve_max_tokens(max_tokens)
        cost = prompt_tokens + budget
        for limit_name in ("tokens_per_minute", "monthly_tokens"):
            limit = getattr(quota, limit_name)
            if cost > limit:
                raise ValueError(f"prompt ({prompt_tokens}) + max_tokens ({budget}) = {cost} tokens exceeds this "
                                 f"tenant's {limit_name} limit of {limit}; lower max_tokens or shorten the prompt")
        now = datetime.fromtimestamp(self.clock(), UTC)
        month_start, next_month = month_bounds(now)
        month = month_start.strftime("%Y-%m")
        reservation_id = uuid.uuid4().hex
        keys = self.keys(tenant.id, month, reservation_id)
        ms_to_next_month = max(1, int((next_month - now).total_seconds() * 1000))
        args = [reservation_id, cost, quota.requests_per_minute, quota.tokens_per_minute,
                quota.max_concurrent_requests, quota.monthly_tokens, self.window_ms, self.slot_ttl_ms,
                self.record_ttl_ms, self.concurrency_retry_ms, ms_to_next_month]
        for _ in range(3):
            try:
                result = await self._reserve(keys=list(keys.values()), args=args)
            except (RedisConnectionError, RedisTimeoutError):
                # The script may have run, or may still run (queued in a frozen Redis), with its answer lost: close
                # the reservation as soon as Redis answers, so a slot and tokens nobody uses are not held.
                self._close_later(Reservation(id=reservation_id, tenant_id=tenant.id, key_id=key_id, month=month,
                                              prompt_tokens=prompt_tokens, max_tokens=budget, reserved_tokens=cost,
                                              headers={}))
                raise
            status = _text(result[0])
            if status != "rebuild":
                break
            await self.rebuild_month(tenant.id, month_start, next_month)
        else:
            raise RuntimeError(f"month counter of tenant {tenant.id} vanished while being rebuilt")
        if status == "void":  # closed before this call ran: only a resend of a call given up on gets here
            raise RedisConnectionError(f"reservation {reservation_id} was closed before it was admitted")
        reason, retry_ms, requests_used, tokens_used, reset_ms = _text(result[1]), *map(int, result[2:6])
        headers = self._rate_headers(quota, requests_used, tokens_used, reset_ms)
        if status == "refused":
            return _refusal(reason, retry_ms, headers, quota)
        return Reservation(id=reservation_id, tenant_id=tenant.id, key_id=key_id, month=month,
                           prompt_tokens=prompt_tokens, max_tokens=budget, reserved_tokens=cost, headers=headers,
                           month_gen=_text(result[7]))

    def _close_later(self, reservation: Reservation) -> None:
        task = asyncio.ensure_future(until_redis_answers(lambda: self.release(reservation),
                                                         f"closing reservation {reservation.id}"))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int,
                     ended_at: float | None = None) -> bool:
        """Charge the real tokens in place of the reserved ones and free the slot. True the first time only.
        ``ended_at`` (epoch seconds, default now): when the request ended, for a month counter rebuilt since."""
        if min(prompt_tokens, completion_tokens) < 0:
            raise ValueError(f"token counts must be non-negative, got {prompt_tokens}, {completion_tokens}")
        return await self._close(reservation, prompt_tokens + completion_tokens, ended_at)

    async def release(self, reservation: Reservation) -> bool:
        """Refund a failed request's tokens and free its slot (it still counts as a request). True the first time."""
        return await self._close(reservation, 0)

    async def _close(self, reservation: Reservation, actual_tokens: int, ended_at: float | None = None) -> bool:
        keys = self.keys(reservation.tenant_id, reservation.month, reservation.id)
        names = [keys["costs"], keys["tokens"], keys["slots"], keys["month"], keys["record"]]
        ended_ms = int((self.clock() if ended_at is None else ended_at) * 1000)
        return bool(await self._settle(keys=names, args=[reservation.id, actual_tokens, reservation.month_gen,
                                                         ended_ms, self.tombstone_ttl_ms]))

    async def renew(self, reservation: Reservation) -> bool:
        """Push the reservation's slot expiry to a full TTL from now; False once the slot is no longer held."""
        slots = self.keys(reservation.tenant_id, reservation.month)["slots"]
        return bool(await self._renew(keys=[slots], args=[reservation.id, self.slot_ttl_ms]))

    async def hold(self, reservation: Reservation) -> None:
        """Keep the reservation's slot while its request runs, however long: renewed every third of the TTL until
        the slot is gone (settled, released) or this is cancelled. A renewal Redis does not answer is tried
        again at the next beat (two more before the slot could lapse)."""
        while True:
            await asyncio.sleep(self.slot_ttl_ms / 3000)
            try:
                if not await self.renew(reservation):
                    return
            except (RedisConnectionError, RedisTimeoutError) as exc:
                logger.warning("slot of reservation %s not renewed: %r", reservation.id, exc)

    async def peek(self, tenant: TenantInfo) -> dict[str, str]:
        """The x-ratelimit-* header values as they stand, reserving nothing (for answers refused before
        `reserve`, such as an unknown model)."""
        keys = self.keys(tenant.id, "")
        requests_used, tokens_used, reset_ms = map(int, await self._peek(
            keys=[keys["window"], keys["costs"], keys["tokens"]], args=[self.window_ms]))
        return self._rate_headers(tenant.quota, requests_used, tokens_used, reset_ms)

    async def rebuild_month(self, tenant_id: int, month_start: datetime, next_month: datetime) -> bool:
        """Recreate the month counter from the usage table unless it exists; True when this call created it."""
        snapshot_ms = int(self.clock() * 1000)  # requests that end from now on are not in the sum (settle.lua)
        used = int(await self.month_usage(tenant_id, month_start, next_month))
        month_key = self.keys(tenant_id, month_start.strftime("%Y-%m"))["month"]
        return bool(await self._rebuild(keys=[month_key],
                                        args=[used, uuid.uuid4().hex, MONTH_KEY_TTL_S, snapshot_ms]))

    def _rate_headers(self, quota, requests_used: int, tokens_used: int, reset_ms: int) -> dict[str, str]:
        reset = format_duration(max(0, reset_ms))
        return {
            "x-ratelimit-limit-requests": str(quota.requests_per_minute),
            "x-ratelimit-remaining-requests": str(max(0, quota.requests_per_minute - requests_used)),
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-limit-tokens": str(quota.tokens_per_minute),
            "x-ratelimit-remaining-tokens": str(max(0, quota.tokens_per_minute - tokens_used)),
            "x-ratelimit-reset-tokens": reset,
        }


def _refusal(reason: str, retry_ms: int, headers: dict[str, str], quota) -> Refusal:
    retry_ms = max(1, retry_ms)
    limit = getattr(quota, reason)
    headers = {**headers, "retry-after": str(math.ceil(retry_ms / 1000)), "retry-after-ms": str(retry_ms)}
    message = f"Rate limit reached: {reason} (limit {limit}); retry in {format_duration(retry_ms)}."
    return Refusal(reason=reason, retry_after_s=retry_ms / 1000, message=message, headers=headers)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_background: set[asyncio.Task] = set()  # strong references to closes still waiting for Redis
# Backoff of calls retried until Redis answers; a reservation's record lives a day (record_ttl_ms): no use past it.
_RETRY_FIRST_S, _RETRY_MAX_S, _GIVE_UP_S = 0.25, 10.0, 86_400.0


async def until_redis_answers(call: Callable[[], Awaitable], what: str,
                              on_failure: Callable[[Exception], None] | None = None) -> bool:
    """``await call()`` again and again, with backoff, while Redis does not answer (for a day at most); True once
    it went through. ``on_failure`` hears each attempt Redis did not answer. Another error ends it (logged:
    retrying cannot help)."""
    delay, give_up_at = _RETRY_FIRST_S, time.monotonic() + _GIVE_UP_S
    while True:
        try:
            await call()
            return True
        except (RedisConnectionError, RedisTimeoutError) as exc:
            if on_failure is not None:
                on_failure(exc)
            if time.monotonic() + delay > give_up_at:
                logger.error("%s abandoned: Redis has not answered for a day", what)
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)
        except Exception:
            logger.exception("%s failed", what)
            return False


async def _usage_table_month_tokens(tenant_id: int, month_start: datetime, next_month: datetime) -> int:
    from tenants.selectors import usage_tokens_between  # the ORM only where Django is set up

    return await usage_tokens_between(tenant_id=tenant_id, start=month_start, end=next_month)


async def _month_tokens_on_gateway_db_thread(tenant_id: int, month_start: datetime, next_month: datetime) -> int:
    """The usage table's month, read on the gateway's database thread (its timeout: a frozen database answers 503
    instead of holding the request)."""
    from tenants.selectors import usage_tokens_between

    return await on_db_thread(usage_tokens_between, tenant_id=tenant_id, start=month_start, end=next_month)


# ---------------------------------------------------------------- one limiter per event loop of a process

_limiters: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, QuotaLimiter]" = weakref.WeakKeyDictionary()


def default_limiter() -> QuotaLimiter:
    """This event loop's limiter over settings.REDIS_URL."""
    loop = asyncio.get_running_loop()
    limiter = _limiters.get(loop)
    if limiter is None:
        from django.conf import settings

        limiter = QuotaLimiter(loop_redis(), slot_ttl_ms=settings.QUOTA_SLOT_TTL_S * 1000,
                               month_usage=_month_tokens_on_gateway_db_thread)
        _limiters[loop] = limiter
    return limiter


async def reserve(tenant: TenantInfo, key_id: str | None, prompt_tokens: int,
                  max_tokens: int | None) -> Reservation | Refusal:
    """Reserve prompt_tokens + max_tokens (the tenant's default when None) and one slot, or say why not."""
    return await default_limiter().reserve(tenant, key_id, prompt_tokens, max_tokens)


async def peek(tenant: TenantInfo) -> dict[str, str]:
    """The tenant's x-ratelimit-* headers now, without reserving anything."""
    return await default_limiter().peek(tenant)


async def settle(reservation: Reservation, prompt_tokens: int, completion_tokens: int,
                 ended_at: float | None = None) -> bool:
    return await default_limiter().settle(reservation, prompt_tokens, completion_tokens, ended_at)


async def release(reservation: Reservation) -> bool:
    return await default_limiter().release(reservation)


async def hold(reservation: Reservation) -> None:
    """Keep the reservation's concurrency slot until it is settled or this is cancelled."""
    await default_limiter().hold(reservation)
