"""The engine replicas of ENGINE_URLS: their health and load, and which one serves a request.

* An adapter's requests go to the replica that ranks first for its id by rendezvous hashing, so the adapter
  stays warm on one replica and only 1/N of adapters move when a replica joins or leaves.
* A hot adapter spreads: while its requests open from this process exceed what its replicas seat (``seats``
  each: the engine's ``max_num_seqs`` from /stats), the next replica of its rendezvous ranking joins its set
  (``k`` grows, at most one step per ``SPREAD_HOLD_S``); when its load has stayed under half of what ``k - 1``
  replicas seat for ``SPREAD_COOL_S``, the last one leaves (hysteresis: no flapping at the boundary). Requests
  go to the least loaded of the set, so a cold adapter keeps one warm replica and a hot one uses several.
* A replica that is down leaves every ranking until it is back, so its adapters go to their next-ranked replica
  (rendezvous hashing over the healthy ones: only its adapters move). When every replica of the set is
  ``saturated`` (its waiting queue over half full), the request spills to the least-loaded healthy replica.
  Base-model requests (resident everywhere) always go to the least loaded.
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
SPREAD_HOLD_S = 2.0  # an adapter's set grows by at most one replica this often
SPREAD_COOL_S = 30.0  # and shrinks after its load stayed low this long
DEFAULT_SEATS = 256  # a replica's seats when its /stats does not say (the engine's default max_num_seqs)


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    saturated: bool = False
    engine_load: int = 0  # running + waiting at the last /stats
    in_flight: int = 0  # this process's requests open on it now
    in_flight_at_check: int = 0
    checked_at: float = float("-inf")
    seats: int = DEFAULT_SEATS  # sequences it runs at once (max_num_seqs)

    @property
    def load(self) -> int:
        """The engine's load at the last check plus what this process sent it since."""
        return max(0, self.engine_load + self.in_flight - self.in_flight_at_check)


def rendezvous_score(key: str, url: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(slots=True)
class Spread:
    """How many replicas of its rendezvous ranking one adapter uses, and its requests open now (this process)."""

    k: int = 1
    in_flight: int = 0
    changed_at: float = float("-inf")
    cool_since: float | None = None  # when its load last fell below the shrink line


def rank_replicas(replicas: list[Replica], affinity_key: str | None, spread: int = 1) -> list[Replica]:
    """Candidates in the order to try them: the choice first (an adapter's: the least loaded healthy, unsaturated
    replica among the first ``spread`` of its rendezvous ranking), then the other healthy ones by load, then the
    down ones (they may be back before the next health check)."""
    healthy = [r for r in replicas if r.healthy]
    down = [r for r in replicas if not r.healthy]
    by_load = sorted(healthy, key=lambda r: (r.load, random.random()))
    first = None
    if affinity_key is not None:
        # over the healthy replicas only: a replica that is down leaves the ranking as if it had left the pool,
        # so its adapters move to their next-ranked replica (and only those move), not to whichever is idle
        ranking = sorted(healthy, key=lambda r: rendezvous_score(affinity_key, r.url), reverse=True)
        usable = [r for r in ranking[:max(1, spread)] if not r.saturated]
        if usable:
            first = min(usable, key=lambda r: r.load)  # ties: the higher ranked (min keeps the first)
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
        self.spreads: dict[str, Spread] = {}  # adapters with requests open or a set wider than one replica

    async def candidates(self, affinity_key: str | None) -> list[Replica]:
        await self._keep_fresh()
        spread = self._resize(affinity_key) if affinity_key is not None else 1
        return rank_replicas(self.replicas, affinity_key, spread)

    def opened(self, replica: Replica, affinity_key: str | None) -> None:
        """A request is open on ``replica`` (its load estimate, and its adapter's, until :meth:`closed`)."""
        replica.in_flight += 1
        if affinity_key is not None:
            self.spreads.setdefault(affinity_key, Spread()).in_flight += 1

    def closed(self, replica: Replica, affinity_key: str | None) -> None:
        replica.in_flight -= 1
        spread = self.spreads.get(affinity_key) if affinity_key is not None else None
        if spread is not None:
            spread.in_flight -= 1
            if spread.in_flight <= 0 and spread.k == 1:
                del self.spreads[affinity_key]

    def spread_of(self, affinity_key: str) -> int:
        spread = self.spreads.get(affinity_key)
        return 1 if spread is None else spread.k

    def _resize(self, affinity_key: str) -> int:
        """The adapter's set size now: one more replica when its open requests (this one included) exceed what
        the set seats, one fewer after its load stayed under half of what one replica fewer seats."""
        spread = self.spreads.get(affinity_key)
        if spread is None:
            return 1
        now = self.clock()
        ranking = sorted(self.replicas, key=lambda r: rendezvous_score(affinity_key, r.url), reverse=True)
        seats = [r.seats for r in ranking]
        demand = spread.in_flight + 1
        if spread.k < len(ranking) and demand > sum(seats[:spread.k]) and now - spread.changed_at >= SPREAD_HOLD_S:
            spread.k += 1
            spread.changed_at, spread.cool_since = now, None
            logger.info("adapter %s spreads to %d replicas (%d requests open)", affinity_key, spread.k, demand - 1)
        elif spread.k > 1 and demand <= sum(seats[:spread.k - 1]) // 2:
            if spread.cool_since is None:
                spread.cool_since = now
            elif now - spread.cool_since >= SPREAD_COOL_S:
                spread.k -= 1
                spread.changed_at, spread.cool_since = now, None
                logger.info("adapter %s narrows to %d replicas", affinity_key, spread.k)
        else:
            spread.cool_since = None
        return spread.k

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
        seats = (body.get("limits") or {}).get("max_num_seqs")
        if isinstance(seats, int) and seats > 0:
            replica.seats = seats
        replica.in_flight_at_check = replica.in_flight
        replica.checked_at = self.clock()
