"""Counters and a snapshot of the adapter slot cache (``GET /stats`` -> ``adapters``, ``ENGINE_PROTOCOL.md``)."""

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ResidentAdapter:
    id: int | str
    slot: int
    rank: int
    pinned_by: int  # running sequences using it


@dataclass(frozen=True, slots=True)
class AdapterCacheStats:
    slots: int
    resident: tuple[ResidentAdapter, ...]  # by slot
    host_tier: tuple[int | str, ...]  # least recently used first
    loading: tuple[int | str, ...]
    hits: int  # acquires that found the adapter in a slot
    misses: int  # acquires that copied it into a slot
    evictions: int  # adapters pushed out of a slot to make room
    host_evictions: int
    loads: int  # completed loads from the store
    load_failures: int
    load_ms_p50: float
    load_ms_p99: float

    def to_dict(self) -> dict:
        return {
            "slots": self.slots,
            "resident": [{"id": r.id, "slot": r.slot, "rank": r.rank, "pinned_by": r.pinned_by} for r in self.resident],
            "host_tier": list(self.host_tier), "loading": list(self.loading),
            "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
            "host_evictions": self.host_evictions, "loads": self.loads, "load_failures": self.load_failures,
            "load_ms_p50": self.load_ms_p50, "load_ms_p99": self.load_ms_p99,
        }


@dataclass(slots=True)
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    host_evictions: int = 0
    loads: int = 0
    load_failures: int = 0
    load_ms: deque = field(default_factory=lambda: deque(maxlen=1024))  # recent successful loads

    def load_ms_quantile(self, q: float) -> float:
        """Nearest-rank quantile of the recent load times; 0.0 before the first load."""
        if not self.load_ms:
            return 0.0
        ordered = sorted(self.load_ms)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
