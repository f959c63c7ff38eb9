"""The adapter slot cache: a bounded set of device slots over a host-memory tier, fed by a background loader.

Device buffers: :class:`engine.lora.slot_buffers.SlotBuffers` (A and B matrices per fused projection group,
per-slot scale and rank), exposed here as ``group_a``, ``group_b``, ``lora_a``, ``lora_b``, ``scales``, ``slot_ranks``.

Tiers: ``loading`` (on the loader thread) -> ``host`` (LRU of ``max_cpu_loras`` LoadedAdapters) -> ``resident``
(in a slot; LRU over unpinned slots). A slot is pinned while running sequences use it (:meth:`acquire` /
:meth:`release`). The engine loop calls :meth:`request_load` and :meth:`poll` and never waits on I/O.
All methods are safe to call from any thread (one lock); the engine loop is meant to be the only mutator.
"""

import threading
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

from engine.lora.cache_stats import AdapterCacheStats, CacheCounters, ResidentAdapter
from engine.lora.errors import AdapterError, AdapterLoadError
from engine.lora.fingerprint import ModelFingerprint
from engine.lora.loader import AdapterLoader, LoadedAdapter
from engine.lora.request import LoRARequest
from engine.lora.slot_buffers import LLAMA_GROUPS, Group, SlotBuffers
from kernels.cpu.openmp import release_thread_pool

AdapterId = int | str


@dataclass(frozen=True, slots=True)
class LoadResult:
    """A finished background load: ``error`` is None when the adapter is now in the host tier."""

    adapter_id: AdapterId
    error: AdapterError | None
    source: LoRARequest | None = None  # the request whose path and sha256 were loaded


@dataclass(slots=True)
class _Resident:
    adapter_id: AdapterId
    rank: int
    sha256: str
    pins: int = 0


class AdapterSlotCache:
    def __init__(
        self,
        fingerprint: ModelFingerprint,
        loader: AdapterLoader,
        *,
        max_loras: int,
        max_cpu_loras: int,
        max_lora_rank: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        num_loader_threads: int = 1,
        groups: tuple[Group, ...] = LLAMA_GROUPS,
        shard=None,
    ):
        if not 1 <= max_loras <= max_cpu_loras:
            raise ValueError(f"need 1 <= max_loras ({max_loras}) <= max_cpu_loras ({max_cpu_loras})")
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be positive, got {max_lora_rank}")
        self.fingerprint, self.loader = fingerprint, loader
        self.num_slots, self.max_cpu_loras, self.max_rank = max_loras, max_cpu_loras, max_lora_rank
        self.buffers = SlotBuffers(fingerprint, num_slots=max_loras, max_rank=max_lora_rank, device=device,
                                   dtype=dtype, groups=groups, shard=shard)  # shard: a tensor-parallel rank's part
        b = self.buffers
        self.group_a, self.group_b, self.lora_a, self.lora_b = b.group_a, b.group_b, b.lora_a, b.lora_b
        self.scales, self.slot_ranks = b.scales, b.slot_ranks  # [num_slots] fp32, [num_slots] int32
        self._slots: list[_Resident | None] = [None] * max_loras
        self._slot_of: dict[AdapterId, int] = {}
        self._evictable: OrderedDict[AdapterId, None] = OrderedDict()  # unpinned residents, LRU first
        self._doomed: set[AdapterId] = set()  # unloaded while pinned: freed at the last release
        self._host: OrderedDict[AdapterId, LoadedAdapter] = OrderedDict()  # LRU first
        self._loading: dict[AdapterId, Future] = {}
        self._loading_source: dict[AdapterId, LoRARequest] = {}  # the request each load in flight reads
        self._counters = CacheCounters()
        self._lock = threading.RLock()
        self._executor = ThreadPoolExecutor(num_loader_threads, thread_name_prefix="lora-loader")

    # ------------------------------------------------------------------ what the model reads

    def group_weights(self, layer: int, group: Group) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lora_a [num_slots, len(group) * max_rank, in], lora_b [num_slots, sum of outs, max_rank])`` of one
        (fused) projection of one layer, to pass with :attr:`scales`, :attr:`slot_ranks` and the step's
        ``token_slots`` to ``kernels.lora_shrink(num_slices=len(group))`` / ``lora_expand(slices=...)``."""
        return self.buffers.group_weights(layer, group)

    def layer_weights(self, layer: int, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lora_a [num_slots, max_rank, in], lora_b [num_slots, out, max_rank])`` of one module of one layer
        (views into its group's buffers)."""
        return self.lora_a[module][layer], self.lora_b[module][layer]

    @property
    def max_resident_rank(self) -> int:
        """Largest rank in a slot (0 if none): ranks past it are zero in every slot, so callers may slice them."""
        with self._lock:
            return max((r.rank for r in self._slots if r is not None), default=0)

    # ------------------------------------------------------------------ queries

    def slot_of(self, adapter_id: AdapterId) -> int | None:
        with self._lock:
            return self._slot_of.get(adapter_id)

    def is_loaded(self, adapter_id: AdapterId) -> bool:
        """In a slot or in the host tier: :meth:`acquire` needs no I/O."""
        with self._lock:
            return adapter_id in self._slot_of or adapter_id in self._host

    def is_loading(self, adapter_id: AdapterId) -> bool:
        with self._lock:
            return adapter_id in self._loading

    def is_resident(self, adapter_id: AdapterId) -> bool:
        """In a slot and not being unloaded: :meth:`acquire` is a hit."""
        with self._lock:
            return adapter_id in self._slot_of and adapter_id not in self._doomed

    def is_unloading(self, adapter_id: AdapterId) -> bool:
        """Unloaded while pinned: it leaves its slot at its last release and cannot be acquired meanwhile."""
        with self._lock:
            return adapter_id in self._doomed

    def pin_counts(self) -> dict[AdapterId, int]:
        """Pinned adapters (not being unloaded) -> the number of running sequences using each."""
        with self._lock:
            return {r.adapter_id: r.pins for r in self._slots
                    if r is not None and r.pins and r.adapter_id not in self._doomed}

    def describe(self, adapter_id: AdapterId) -> dict | None:
        """What the cache holds of a loaded adapter (``id``, ``rank``, ``sha256``, ``slot``, ``pinned_by``,
        ``in_host_tier``; from the host tier also ``scaling``, ``target_modules``, ``load_ms``), or None."""
        with self._lock:
            slot, host = self._slot_of.get(adapter_id), self._host.get(adapter_id)
            if slot is None and host is None:
                return None
            resident = self._slots[slot] if slot is not None else None
            info = {"id": adapter_id, "slot": slot, "pinned_by": resident.pins if resident else 0,
                    "in_host_tier": host is not None}
            if host is None:
                return {**info, "rank": resident.rank, "sha256": resident.sha256}
            return {**info, "rank": host.rank, "sha256": host.sha256, "scaling": host.scaling,
                    "target_modules": list(host.spec.target_modules), "load_ms": round(host.load_ms, 3)}

    def loaded_ids(self) -> list[AdapterId]:
        """Adapters in a slot (by slot) then those only in the host tier (least recently used first)."""
        with self._lock:
            resident = [r.adapter_id for r in self._slots if r is not None]
            return resident + [a for a in self._host if a not in self._slot_of]

    @property
    def num_loading(self) -> int:
        with self._lock:
            return len(self._loading)

    def wait_for_load(self, timeout: float) -> None:
        """Block until a pending load finishes or ``timeout`` seconds pass (for an engine with nothing else to do)."""
        with self._lock:
            futures = list(self._loading.values())
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)

    def content_hash(self, adapter_id: AdapterId) -> str:
        """sha256 of the adapter's weights (for prefix-cache keys); the adapter must be loaded."""
        with self._lock:
            slot = self._slot_of.get(adapter_id)
            return self._slots[slot].sha256 if slot is not None else self._host[adapter_id].sha256

    # ------------------------------------------------------------------ loading (never blocks)

    def request_load(self, request: LoRARequest) -> None:
        """Start fetching ``request`` into the host tier on the loader thread, unless loaded or loading."""
        with self._lock:
            if request.id in self._loading or self.is_loaded(request.id):
                return
            self._loading[request.id] = self._executor.submit(self._load, request)
            self._loading_source[request.id] = request

    def _load(self, request: LoRARequest):
        """On a loader thread: the load, then that thread's OpenMP workers let go of (``kernels.cpu.openmp``: left
        alive, they slow every step of the engine's)."""
        try:
            return self.loader.load(request)
        finally:
            release_thread_pool()

    def poll(self) -> list[LoadResult]:
        """Collect finished loads: successes enter the host tier (evicting its LRU entry); each is reported once."""
        results = []
        with self._lock:
            for adapter_id, future in list(self._loading.items()):
                if not future.done():
                    continue
                del self._loading[adapter_id]
                source = self._loading_source.pop(adapter_id, None)
                error = _error_of(future)
                if error is None:
                    self._host_put(future.result())
                else:
                    self._counters.load_failures += 1
                results.append(LoadResult(adapter_id, error, source))
        return results

    def _host_put(self, adapter: LoadedAdapter) -> None:
        self._counters.loads += 1
        self._counters.load_ms.append(adapter.load_ms)
        self._host[adapter.id] = adapter
        self._host.move_to_end(adapter.id)
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
            self._counters.host_evictions += 1

    # ------------------------------------------------------------------ slots

    def can_acquire(self, adapter_id: AdapterId) -> bool:
        """True if :meth:`acquire` would succeed now: resident, or loaded with a free or evictable slot."""
        with self._lock:
            if adapter_id in self._doomed:
                return False
            if adapter_id in self._slot_of:
                return True
            return adapter_id in self._host and (None in self._slots or bool(self._evictable))

    def acquire(self, adapter_id: AdapterId) -> int:
        """Pin the adapter in a slot (copying it in, evicting the LRU unpinned adapter if need be); return the slot."""
        with self._lock:
            if not self.can_acquire(adapter_id):
                raise RuntimeError(f"adapter {adapter_id!r} cannot be acquired now (check can_acquire first)")
            slot = self._slot_of.get(adapter_id)
            if slot is not None:
                self._counters.hits += 1
                self._evictable.pop(adapter_id, None)
            else:
                self._counters.misses += 1
                slot = self._take_slot()
                self._write_slot(slot, self._host[adapter_id])
            if adapter_id in self._host:
                self._host.move_to_end(adapter_id)
            self._slots[slot].pins += 1
            return slot

    def release(self, adapter_id: AdapterId) -> None:
        """Unpin once (a sequence using the adapter finished or was preempted)."""
        with self._lock:
            slot = self._slot_of.get(adapter_id)
            if slot is None or self._slots[slot].pins == 0:
                raise RuntimeError(f"adapter {adapter_id!r} is not pinned")
            resident = self._slots[slot]
            resident.pins -= 1
            if resident.pins == 0:
                if adapter_id in self._doomed:
                    self._free_slot(slot)
                else:
                    self._evictable[adapter_id] = None

    def unload(self, adapter_id: AdapterId) -> bool:
        """Drop the adapter from every tier; True if gone now, False if pinned (freed at its last release)."""
        with self._lock:
            self._host.pop(adapter_id, None)
            future = self._loading.pop(adapter_id, None)
            self._loading_source.pop(adapter_id, None)
            if future is not None:
                future.cancel()  # a load already running finishes on its thread; its result is dropped
            slot = self._slot_of.get(adapter_id)
            if slot is None:
                return True
            if self._slots[slot].pins == 0:
                self._free_slot(slot)
                return True
            self._doomed.add(adapter_id)
            return False

    def keep(self, adapter_id: AdapterId) -> bool:
        """Cancel a pending unload (the adapter is wanted again while its last users still run); True if one was
        pending. Its slot still holds the same version: an id names immutable weights."""
        with self._lock:
            if adapter_id not in self._doomed:
                return False
            self._doomed.discard(adapter_id)
            return True

    def _take_slot(self) -> int:
        if None in self._slots:
            return self._slots.index(None)
        victim, _ = self._evictable.popitem(last=False)
        self._counters.evictions += 1
        slot = self._slot_of[victim]
        self._free_slot(slot)
        return slot

    def _free_slot(self, slot: int) -> None:
        resident = self._slots[slot]
        self._slots[slot] = None
        del self._slot_of[resident.adapter_id]
        self._evictable.pop(resident.adapter_id, None)
        self._doomed.discard(resident.adapter_id)
        self.buffers.clear(slot)

    def _write_slot(self, slot: int, adapter: LoadedAdapter) -> None:
        self.buffers.write(slot, adapter)
        self._slots[slot] = _Resident(adapter.id, adapter.rank, adapter.sha256)
        self._slot_of[adapter.id] = slot

    # ------------------------------------------------------------------ stats, invariants, shutdown

    def stats(self) -> AdapterCacheStats:
        with self._lock:
            c = self._counters
            resident = tuple(ResidentAdapter(r.adapter_id, slot, r.rank, r.pins)
                             for slot, r in enumerate(self._slots) if r is not None)
            return AdapterCacheStats(
                slots=self.num_slots, resident=resident, host_tier=tuple(self._host), loading=tuple(self._loading),
                hits=c.hits, misses=c.misses, evictions=c.evictions, host_evictions=c.host_evictions,
                loads=c.loads, load_failures=c.load_failures,
                load_ms_p50=c.load_ms_quantile(0.5), load_ms_p99=c.load_ms_quantile(0.99),
            )

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (end of a step in debug and test runs)."""
        with self._lock:
            occupied = {r.adapter_id: slot for slot, r in enumerate(self._slots) if r is not None}
            assert occupied == self._slot_of, (occupied, self._slot_of)
            unpinned = {a for a, s in occupied.items() if self._slots[s].pins == 0 and a not in self._doomed}
            assert set(self._evictable) == unpinned, (list(self._evictable), unpinned)
            assert all(self._slots[occupied[a]].pins > 0 for a in self._doomed), self._doomed
            assert len(self._host) <= self.max_cpu_loras
            for slot, r in enumerate(self._slots):
                assert r is not None or float(self.scales[slot]) == 0.0, f"free slot {slot} has a scale"
                assert r is None or r.pins >= 0

    def close(self) -> None:
        """Stop the loader thread (pending loads are cancelled)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _error_of(future: Future) -> AdapterError | None:
    if future.cancelled():
        return AdapterLoadError("load_cancelled", "the load was cancelled")
    exc = future.exception()
    if exc is None or isinstance(exc, AdapterError):
        return exc
    return AdapterLoadError("load_failed", f"{type(exc).__name__}: {exc}")
