"""AdapterSlotCache: exact bookkeeping of slots, pins, LRU evictions, the host tier and background loads."""

import hashlib
import threading
import time

import pytest
import torch

from engine.lora import slot_cache
from engine.lora.errors import AdapterSourceNotAllowed
from engine.lora.fingerprint import TARGET_MODULES
from engine.lora.loader import AdapterLoader
from engine.lora.request import LoRARequest
from engine.lora.slot_cache import AdapterSlotCache
from tests.support.peft_factory import make_peft_adapter

MAX_RANK = 16
# name -> (rank, alpha, rslora, target modules)
SPECS = {
    "a": (8, 16, False, ["q_proj", "v_proj"]),
    "b": (16, 8, True, list(TARGET_MODULES)),
    "c": (2, 4, False, ["down_proj", "k_proj"]),
    "d": (1, 2, False, ["o_proj"]),
}


@pytest.fixture(scope="module")
def adapter_root(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("slot_cache_adapters")
    for seed, (name, (rank, alpha, rslora, targets)) in enumerate(SPECS.items()):
        make_peft_adapter(tiny_llama_dir, root / name, rank=rank, alpha=alpha, use_rslora=rslora,
                          target_modules=targets, seed=10 + seed)
    return root


@pytest.fixture
def make_cache(adapter_root, fingerprint):
    caches = []

    def make(max_loras=2, max_cpu_loras=4, loader=None):
        loader = loader or AdapterLoader(fingerprint, max_rank=MAX_RANK, allowed_sources=[str(adapter_root)])
        cache = AdapterSlotCache(fingerprint, loader, max_loras=max_loras, max_cpu_loras=max_cpu_loras,
                                 max_lora_rank=MAX_RANK)
        caches.append(cache)
        return cache

    yield make
    for cache in caches:
        cache.check_invariants()
        cache.close()


def request(adapter_root, name, **kwargs) -> LoRARequest:
    return LoRARequest(name, f"id-{name}", str(adapter_root / name), **kwargs)


def wait_for(cache, count, timeout=30.0):
    results, deadline = [], time.monotonic() + timeout
    while len(results) < count:
        assert time.monotonic() < deadline, f"only {len(results)} of {count} loads finished"
        results += cache.poll()
        time.sleep(0.005)
    return results


def load(cache, adapter_root, *names):
    for name in names:
        cache.request_load(request(adapter_root, name))
    results = wait_for(cache, len(names))
    assert all(r.error is None for r in results), results
    cache.check_invariants()


def resident(cache):
    return [(r.id, r.slot, r.rank, r.pinned_by) for r in cache.stats().resident]


def slot_contents(cache, slot):
    return ({m: cache.lora_a[m][:, slot].clone() for m in TARGET_MODULES},
            {m: cache.lora_b[m][:, slot].clone() for m in TARGET_MODULES}, float(cache.scales[slot]))


def test_buffer_layout_for_the_model(make_cache):
    cache = make_cache(max_loras=3)
    qkv, gate_up = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
    assert cache.group_a[qkv].shape == (2, 3, 3 * MAX_RANK, 576)  # A stacked on the rank axis
    assert cache.group_b[qkv].shape == (2, 3, 576 + 192 + 192, MAX_RANK)  # B stacked on the output axis
    assert cache.group_a[("down_proj",)].shape == (2, 3, MAX_RANK, 1536)
    assert cache.lora_a["q_proj"].shape == (2, 3, MAX_RANK, 576)
    assert cache.lora_b["k_proj"].shape == (2, 3, 192, MAX_RANK)
    a, b = cache.group_weights(1, gate_up)
    assert a.shape == (3, 2 * MAX_RANK, 576) and b.shape == (3, 3072, MAX_RANK)
    assert a.is_contiguous() and b.is_contiguous()
    up_a, up_b = cache.layer_weights(1, "up_proj")  # views of up's part of the fused buffers, not copies
    assert up_a.shape == (3, MAX_RANK, 576) and up_b.shape == (3, 1536, MAX_RANK)
    assert up_a.data_ptr() == a[0, MAX_RANK:].data_ptr() and up_b.data_ptr() == b[0, 1536:].data_ptr()
    assert cache.scales.shape == (3,) and not cache.scales.any()
    assert cache.slot_ranks.dtype == torch.int32 and not cache.slot_ranks.any()


def test_slot_contents_after_a_load(make_cache, adapter_root):
    cache = make_cache()
    req = request(adapter_root, "a")
    cache.request_load(req)
    assert cache.is_loading("id-a") and not cache.is_loaded("id-a")
    assert wait_for(cache, 1)[0].adapter_id == "id-a"
    assert cache.is_loaded("id-a") and cache.stats().host_tier == ("id-a",)
    host = cache._host["id-a"]
    assert cache.acquire("id-a") == 0
    assert cache.content_hash("id-a") == hashlib.sha256(
        (adapter_root / "a" / "adapter_model.safetensors").read_bytes()).hexdigest()
    lora_a, lora_b, scale = slot_contents(cache, 0)
    assert scale == 2.0  # 16 / 8
    for module in TARGET_MODULES:
        if module in ("q_proj", "v_proj"):
            assert torch.equal(lora_a[module][:, :8], host.lora_a[module])
            assert torch.equal(lora_b[module][:, :, :8], host.lora_b[module])
            assert lora_a[module][:, :8].abs().sum() > 0 and lora_b[module][:, :, :8].abs().sum() > 0
        assert not lora_a[module][:, 8:].any() and not lora_b[module][:, :, 8:].any()
        if module not in ("q_proj", "v_proj"):
            assert not lora_a[module].any() and not lora_b[module].any()
    assert resident(cache) == [("id-a", 0, 8, 1)] and cache.max_resident_rank == 8
    assert cache.slot_ranks.tolist() == [8, 0]


def test_hits_misses_pins_and_lru_eviction(make_cache, adapter_root):
    cache = make_cache(max_loras=2)
    load(cache, adapter_root, "a", "b", "c")
    assert (cache.acquire("id-a"), cache.acquire("id-b"), cache.acquire("id-a")) == (0, 1, 0)
    assert resident(cache) == [("id-a", 0, 8, 2), ("id-b", 1, 16, 1)]
    assert not cache.can_acquire("id-c")  # both slots pinned
    cache.release("id-b")
    cache.release("id-a")
    cache.release("id-a")
    assert list(cache._evictable) == ["id-b", "id-a"]  # LRU first: b was unpinned first
    assert cache.acquire("id-c") == 1  # evicts b
    assert resident(cache) == [("id-a", 0, 8, 0), ("id-c", 1, 2, 1)]
    assert cache.slot_of("id-b") is None and cache.is_loaded("id-b")  # still in the host tier
    assert cache.acquire("id-b") == 0  # evicts a, the only unpinned one
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions) == (1, 4, 2)
    assert resident(cache) == [("id-b", 0, 16, 1), ("id-c", 1, 2, 1)]
    cache.check_invariants()


def test_evicted_then_reloaded_adapter_has_identical_buffers(make_cache, adapter_root):
    cache = make_cache(max_loras=2)
    load(cache, adapter_root, "a", "b", "c", "d")
    cache.acquire("id-c")
    first = slot_contents(cache, 0)
    cache.release("id-c")
    for name in ("b", "d"):  # b (rank 16, all modules) then d overwrite the slots c used
        cache.acquire(f"id-{name}")
        cache.release(f"id-{name}")
    assert cache.slot_of("id-c") is None
    slot = cache.acquire("id-c")
    again = slot_contents(cache, slot)
    assert again[2] == first[2]
    for module in TARGET_MODULES:
        assert torch.equal(again[0][module], first[0][module]) and torch.equal(again[1][module], first[1][module])


def test_host_tier_is_lru_and_bounded(make_cache, adapter_root):
    cache = make_cache(max_loras=1, max_cpu_loras=2)
    load(cache, adapter_root, "a", "b")
    cache.acquire("id-a")  # touches a: b becomes the LRU host entry
    cache.release("id-a")
    load(cache, adapter_root, "c")
    stats = cache.stats()
    assert stats.host_tier == ("id-a", "id-c") and stats.host_evictions == 1 and stats.loads == 3
    assert not cache.is_loaded("id-b") and not cache.can_acquire("id-b")
    load(cache, adapter_root, "d")  # evicts a from the host tier, but a stays resident in its slot
    assert cache.stats().host_tier == ("id-c", "id-d") and cache.slot_of("id-a") == 0
    assert cache.acquire("id-a") == 0 and cache.stats().hits == 1


def test_failed_loads_are_reported_once_and_can_be_retried(make_cache, adapter_root, tmp_path):
    cache = make_cache()
    cache.request_load(request(adapter_root, "a", sha256="0" * 64))
    cache.request_load(LoRARequest("x", "id-x", str(tmp_path)))  # outside the allow-list
    errors = {r.adapter_id: r.error for r in wait_for(cache, 2)}
    assert errors["id-a"].code == "sha256_mismatch"
    assert isinstance(errors["id-x"], AdapterSourceNotAllowed)
    assert cache.poll() == [] and not cache.is_loaded("id-a") and not cache.is_loading("id-a")
    assert cache.stats().load_failures == 2 and cache.stats().loads == 0
    load(cache, adapter_root, "a")
    assert cache.can_acquire("id-a")


def test_the_engine_loop_never_waits_on_a_load(make_cache, adapter_root, fingerprint):
    gate = threading.Event()

    class SlowLoader(AdapterLoader):
        def load(self, req):
            assert gate.wait(30)
            if req.name == "boom":
                raise OSError("disk on fire")
            return super().load(req)

    cache = make_cache(loader=SlowLoader(fingerprint, max_rank=MAX_RANK, allowed_sources=[str(adapter_root)]))
    start = time.perf_counter()
    cache.request_load(request(adapter_root, "a"))
    cache.request_load(LoRARequest("boom", "id-boom", str(adapter_root / "b")))
    assert cache.poll() == [] and cache.stats().loading == ("id-a", "id-boom")
    assert time.perf_counter() - start < 1.0
    gate.set()
    errors = {r.adapter_id: r.error for r in wait_for(cache, 2)}
    assert errors["id-a"] is None
    assert errors["id-boom"].code == "load_failed" and "disk on fire" in errors["id-boom"].message


def test_unload_frees_now_or_after_the_last_release(make_cache, adapter_root):
    cache = make_cache(max_loras=2)
    load(cache, adapter_root, "a", "b")
    cache.acquire("id-a")
    cache.release("id-a")
    assert cache.unload("id-a") is True
    assert cache.slot_of("id-a") is None and not cache.is_loaded("id-a") and float(cache.scales[0]) == 0.0
    assert int(cache.slot_ranks[0]) == 0
    cache.acquire("id-b")
    assert cache.unload("id-b") is False  # in use: finishes first
    assert not cache.can_acquire("id-b") and cache.slot_of("id-b") == 0
    cache.check_invariants()
    cache.release("id-b")
    assert cache.slot_of("id-b") is None and resident(cache) == []
    cache.request_load(request(adapter_root, "c"))
    assert cache.unload("id-c") is True and not cache.is_loading("id-c")
    time.sleep(0.5)
    assert cache.poll() == [] and not cache.is_loaded("id-c")  # the dropped load's result is discarded


def test_misuse_is_refused(make_cache, adapter_root):
    cache = make_cache()
    with pytest.raises(RuntimeError, match="cannot be acquired"):
        cache.acquire("id-a")
    load(cache, adapter_root, "a")
    with pytest.raises(RuntimeError, match="not pinned"):
        cache.release("id-a")
    with pytest.raises(ValueError, match="max_cpu_loras"):
        make_cache(max_loras=4, max_cpu_loras=2)


def test_stats_have_the_protocol_shape(make_cache, adapter_root):
    cache = make_cache()
    load(cache, adapter_root, "d")
    cache.acquire("id-d")
    stats = cache.stats().to_dict()
    assert stats["resident"] == [{"id": "id-d", "slot": 0, "rank": 1, "pinned_by": 1}]
    assert {k: stats[k] for k in ("slots", "host_tier", "hits", "misses", "evictions")} == {
        "slots": 2, "host_tier": ["id-d"], "hits": 0, "misses": 1, "evictions": 0}
    assert stats["load_ms_p50"] > 0 and stats["load_ms_p99"] >= stats["load_ms_p50"]


def test_what_the_scheduler_and_the_admin_api_ask(make_cache, adapter_root):
    cache = make_cache(max_loras=2)
    assert cache.describe("id-a") is None and cache.loaded_ids() == [] and cache.num_loading == 0
    cache.request_load(request(adapter_root, "a"))
    assert cache.num_loading == 1
    cache.wait_for_load(30)  # returns once the load is done, without polling
    assert cache.num_loading == 1 and len(cache.poll()) == 1 and cache.num_loading == 0
    load(cache, adapter_root, "b", "c")
    info = cache.describe("id-a")
    assert {k: info[k] for k in ("id", "rank", "slot", "pinned_by", "in_host_tier", "scaling")} == {
        "id": "id-a", "rank": 8, "slot": None, "pinned_by": 0, "in_host_tier": True, "scaling": 2.0}
    assert info["target_modules"] == ["q_proj", "v_proj"] and info["load_ms"] > 0
    cache.acquire("id-c")
    cache.acquire("id-c")
    cache.acquire("id-b")
    assert cache.is_resident("id-c") and not cache.is_resident("id-a")
    assert cache.pin_counts() == {"id-c": 2, "id-b": 1}  # by slot
    assert cache.loaded_ids() == ["id-c", "id-b", "id-a"]  # slots first, then the host tier's LRU order
    cache.unload("id-b")
    assert cache.is_unloading("id-b") and not cache.is_resident("id-b") and cache.pin_counts() == {"id-c": 2}
    assert cache.describe("id-b") == {"id": "id-b", "slot": 1, "pinned_by": 1, "in_host_tier": False, "rank": 16,
                                      "sha256": cache.content_hash("id-b")}
    cache.release("id-b")
    assert not cache.is_unloading("id-b") and cache.describe("id-b") is None
    assert cache.unload("id-c") is False and cache.keep("id-c") is True  # wanted again before its users finished
    assert cache.is_resident("id-c") and not cache.keep("id-c")
    cache.release("id-c")
    cache.release("id-c")
    assert cache.slot_of("id-c") == 0


def test_a_loader_thread_lets_go_of_its_openmp_workers_after_a_load(make_cache, adapter_root, monkeypatch):
    """Left alive, a loader thread's OpenMP pool slows every engine step (kernels/cpu/openmp.py): each load ends by
    releasing it, on the loader thread, whether the load succeeded or failed."""
    released = []
    monkeypatch.setattr(slot_cache, "release_thread_pool", lambda: released.append(threading.current_thread().name))
    cache = make_cache()
    load(cache, adapter_root, "a")
    cache.request_load(request(adapter_root, "b", sha256="0" * 64))  # fails its checksum
    assert wait_for(cache, 1)[0].error is not None
    assert len(released) == 2 and all(name.startswith("lora-loader") for name in released)
