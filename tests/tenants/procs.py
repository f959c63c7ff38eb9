"""Work done in child processes by the multi-process tests (imported by spawned interpreters: no Django setup)."""

import asyncio
import time

import redis.asyncio as aioredis

from tenants.effective_quota import EffectiveQuota
from tenants.identity import TenantInfo
from tenants.limiter import QuotaLimiter, Reservation


async def _zero(tenant_id, start, end) -> int:
    return 0


def reserve_burst(redis_url: str, tenant_id: int, quota: dict, num_requests: int, prompt_tokens: int,
                  max_tokens: int, start_at: float, settle_tokens: int | None = None) -> list[int]:
    """Fire `num_requests` concurrent reservations at `start_at` (epoch s); the reserved tokens of each admitted
    one (settled at once to `settle_tokens` real tokens when given)."""

    async def main() -> list[int]:
        client = aioredis.Redis.from_url(redis_url, max_connections=num_requests)
        limiter = QuotaLimiter(client, month_usage=_zero)
        info = TenantInfo(id=tenant_id, slug="burst", quota=EffectiveQuota(**quota))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        outcomes = await asyncio.gather(*(limiter.reserve(info, "k", prompt_tokens, max_tokens)
                                          for _ in range(num_requests)))
        admitted = [o for o in outcomes if isinstance(o, Reservation)]
        if settle_tokens is not None:
            await asyncio.gather(*(limiter.settle(r, settle_tokens, 0) for r in admitted))
        await client.aclose()
        return [r.reserved_tokens for r in admitted]

    return asyncio.run(main())
