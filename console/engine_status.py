"""What operators see of each engine replica in ENGINE_URLS: `/health` and `/stats` (ENGINE_PROTOCOL.md), asked
of every replica at once with short timeouts, so one slow or dead replica shows as down instead of holding up
the page (or failing it)."""

import asyncio
from dataclasses import dataclass, field

import httpx

from adapters.engine_client import Probe, probe

TIMEOUT = httpx.Timeout(2.0, connect=1.0)
UP, UNHEALTHY, DOWN = "up", "unhealthy", "down"  # serving; answering but not serving (or refusing us); silent


@dataclass(slots=True)
class ResidentAdapter:
    engine_id: str
    slot: int | None  # None: in the host tier only
    rank: int | None
    pinned_by: int  # running requests that hold the slot
    # Filled by the caller from the registry: who owns it (None when no version has this id).
    tenant_name: str = ""
    tenant_slug: str = ""
    adapter_name: str = ""
    version: int | None = None
    deleted: bool = False


@dataclass(slots=True)
class ReplicaStatus:
    url: str
    state: str  # UP, UNHEALTHY or DOWN
    problem: str = ""  # why it is not UP, in words
    model: str = ""
    uptime_s: float = 0.0
    running: int = 0
    waiting: int = 0
    finished: int = 0
    aborted: int = 0
    saturated: bool = False
    kv_total: int = 0
    kv_used: int = 0
    kv_cached: int = 0
    prefix_hit_rate: float = 0.0
    slots: int = 0
    slot_hits: int = 0
    slot_misses: int = 0
    evictions: int = 0
    load_ms_p50: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    resident: list[ResidentAdapter] = field(default_factory=list)  # in device slots, by slot
    host_tier: list[ResidentAdapter] = field(default_factory=list)  # in host memory only

    @property
    def kv_share(self) -> float:
        """Percent of the KV blocks in use."""
        return round(100 * self.kv_used / self.kv_total, 1) if self.kv_total else 0.0

    @property
    def slot_hit_rate(self) -> float | None:
        """Requests whose adapter was already in a slot, of all that needed one; None before any did."""
        asked = self.slot_hits + self.slot_misses
        return self.slot_hits / asked if asked else None

    def adapters(self) -> list[ResidentAdapter]:
        return self.resident + self.host_tier


async def fleet_status(urls: list[str], api_key: str, *, transport: httpx.AsyncBaseTransport | None = None
                       ) -> list[ReplicaStatus]:
    """The status of every replica, in the order of ``urls``; never raises for a replica's failure."""
    async with httpx.AsyncClient(transport=transport) as client:
        probes = await asyncio.gather(*(probe(client, url, api_key, timeout=TIMEOUT) for url in urls))
    return [replica_status(p) for p in probes]


def replica_status(read: Probe) -> ReplicaStatus:
    if read.health_status is None:
        return ReplicaStatus(read.url, DOWN, read.problem)
    if read.stats is None:
        return ReplicaStatus(read.url, UNHEALTHY, read.problem)
    try:
        status = parse_stats(read.url, read.stats)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ReplicaStatus(read.url, UNHEALTHY, "/stats answered something that is not the engine protocol's JSON")
    if read.health_status != 200:
        status.state, status.problem = UNHEALTHY, f"/health answered HTTP {read.health_status}"
    return status


def parse_stats(url: str, body: dict) -> ReplicaStatus:
    """A replica's `/stats` JSON (ENGINE_PROTOCOL.md) as a ReplicaStatus; KeyError/TypeError when malformed."""
    requests, kv, adapters = body["requests"], body["kv_blocks"], body.get("adapters") or {}
    tokens = body.get("tokens") or {}
    resident = [ResidentAdapter(str(item["id"]), int(item["slot"]), _int_or_none(item.get("rank")),
                                int(item.get("pinned_by", 0)))
                for item in adapters.get("resident", [])]
    in_slots = {adapter.engine_id for adapter in resident}
    host_tier = [ResidentAdapter(str(engine_id), None, None, 0)
                 for engine_id in adapters.get("host_tier", []) if engine_id not in in_slots]
    return ReplicaStatus(
        url=url, state=UP, model=str(body.get("model", "")), uptime_s=float(body.get("uptime_s", 0)),
        running=int(requests["running"]), waiting=int(requests["waiting"]),
        finished=int(requests.get("finished", 0)), aborted=int(requests.get("aborted", 0)),
        saturated=bool(body.get("saturated", False)),
        kv_total=int(kv["total"]), kv_used=int(kv["used"]), kv_cached=int(kv.get("cached", 0)),
        prefix_hit_rate=float(body.get("prefix_cache_hit_rate", 0.0)),
        slots=int(adapters.get("slots", 0)), slot_hits=int(adapters.get("hits", 0)),
        slot_misses=int(adapters.get("misses", 0)), evictions=int(adapters.get("evictions", 0)),
        load_ms_p50=float(adapters.get("load_ms_p50", 0.0)),
        prompt_tokens=int(tokens.get("prompt", 0)), generated_tokens=int(tokens.get("generated", 0)),
        resident=sorted(resident, key=lambda adapter: adapter.slot), host_tier=host_tier,
    )


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)
