"""The engine replicas of ENGINE_URLS: their health and load, and which one serves a request.

* An adapter's requests go to the replica that ranks first for its id by rendezvous hashing, so the adapter
  stays warm on one replica and only 1/N of adapters move when a replica joins or leaves.
* When that replica is down or ``saturated`` (its waiting queue over half full), the request spills to the
  least-loaded healthy replica. Base-model requests (resident everywhere) always go to the least loaded.
* Health and load come from ``GET /health`` and ``GET /stats``, re-read in the background when older than the
  TTL (a request never waits for them, but the very first). Between reads, the load estimate follows this
  process's own open requests; a replica that refuses a connection is marked down at once.
"""

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from adapters.engine_client import probe

logger = logging.getLogger("gateway.replicas")
PROBE_TIMEOUT_S = 2.0


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    saturated: bool = False
    engine_load: int = 0  # running + waiting at the last /stats
    in_flight: int = 0  # this process's requests open on it now
    in_flight_at_check: int = 0
    checked_at: float = float("-inf")

    @property
    def load(self) -> int:
        """The engine's load at the last check plus what this process sent it since."""
        return max(0, self.engine_load + self.in_flight - self.in_flight_at_check)


def rendezvous_score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank_replicas(replicas: list[Replica], affinity_key: str | None) -> list[Replica]:
    """Candidates in the order to try them: the choice first, then the other healthy ones by load, then the
    down ones (they may be back before the next health check)."""
    healthy = [r for r in replicas if r.healthy]
    down = [r for r in replicas if not r.healthy]
    by_load = sorted(healthy, key=lambda r: (r.load, random.random()))
    first = None
    if affinity_key is not None:
        preferred = max(replicas, key=lambda r: rendezvous_score(affinity_key, r.url))
        if preferred.healthy and not preferred.saturated:
            first = preferred
    if first is None:
        unsaturated = [r for r in by_load if not r.saturated]
        first = unsaturated[0] if unsaturated else (by_load[0] if by_load else None)
    ordered = ([first] if first else []) + [r for r in by_load if r is not first]
    if affinity_key is not None:
        down.sort(key=lambda r: rendezvous_score(affinity_key, r.url), reverse=True)
    return ordered + down


class ReplicaPool:
    def __init__(self, urls: list[str], http: httpx.AsyncClient, api_key: str, *, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if not urls:
            raise ValueError("the gateway needs at least one engine in ENGINE_URLS")
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self.http = http
        self.api_key = api_key
        self.ttl_s = ttl_s
        self.clock = clock
        self._refreshing: asyncio.Task | None = None

    async def candidates(self, affinity_key: str | None) -> list[Replica]:
        await self._keep_fresh()
        return rank_replicas(self.replicas, affinity_key)

    def mark_down(self, replica: Replica) -> None:
        if replica.healthy:
            logger.warning("engine %s marked down", replica.url)
        replica.healthy = False

    async def _keep_fresh(self) -> None:
        now = self.clock()
        if all(now - r.checked_at <= self.ttl_s for r in self.replicas):
            return
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self.refresh())
        if all(r.checked_at == float("-inf") for r in self.replicas):
            await asyncio.shield(self._refreshing)  # nothing known yet: the first request waits for it

    async def refresh(self) -> None:
        await asyncio.gather(*(self._probe(r) for r in self.replicas))

    async def _probe(self, replica: Replica) -> None:
        read = await probe(self.http, replica.url, self.api_key, timeout=PROBE_TIMEOUT_S)
        healthy, body = read.serving, read.stats or {}
        if not healthy:
            logger.info("engine %s probe failed: %s", replica.url, read.problem or f"/health {read.health_status}")
        requests = body.get("requests") or {}
        if healthy != replica.healthy:
            logger.warning("engine %s is %s", replica.url, "up" if healthy else "down")
        replica.healthy = healthy
        replica.saturated = bool(body.get("saturated"))
        replica.engine_load = int(requests.get("running", 0)) + int(requests.get("waiting", 0))
        replica.in_flight_at_check = replica.in_flight
        replica.checked_at = self.clock()
