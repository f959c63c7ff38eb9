"""glibc's malloc thresholds are raised for CPU engines (freed activations stay in the heap); the KV cache's zeroed
mapping, and its pages faulted in ahead by a background thread."""

import ctypes
import gc
import logging
import mmap
import os
import platform

import pytest
import torch

from engine import host_memory
from engine.host_memory import keep_freed_memory, prefault, zeroed


def test_thresholds_are_raised_on_glibc():
    if platform.libc_ver()[0] != "glibc":
        assert keep_freed_memory() is False  # nothing to tune elsewhere, and no error
        return
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_zeroed_is_a_writable_zero_tensor_whose_views_keep_it_alive(dtype):
    cache = zeroed((2, 3, 40, 16, 3, 64), dtype)  # the KV cache's [2, L, blocks, bs, Hkv, D]
    assert cache.shape == (2, 3, 40, 16, 3, 64) and cache.dtype == dtype and cache.is_contiguous()
    assert not bool(cache.any())
    layers = list(cache[1])  # what the model binds: per-layer views
    del cache
    gc.collect()
    layers[2][7, 3] = 1.5  # writable, and still mapped once the whole tensor is gone
    assert float(layers[2].float().sum()) == 1.5 * 3 * 64
    assert not bool(layers[0].any()) and not bool(layers[1].any())


def test_zeroed_of_nothing():
    assert zeroed((2, 0, 16), torch.bfloat16).shape == (2, 0, 16)


def _resident_pages(tensor: torch.Tensor) -> tuple[int, int]:
    """(pages of the tensor's mapping in memory, pages in all), from mincore(2)."""
    storage = tensor.untyped_storage()
    page = mmap.PAGESIZE
    start, nbytes = storage.data_ptr(), storage.nbytes()
    first = start // page * page
    pages = (start + nbytes - first + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(first, pages * page, vec) == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec), pages


@pytest.mark.skipif(platform.system() != "Linux", reason="madvise(MADV_POPULATE_WRITE) and mincore are Linux's")
@pytest.mark.parametrize("parts", [1, 2 * 3, 7])  # 7 does not divide the storage: taken as one part
def test_prefault_brings_every_page_in_and_leaves_the_zeros(parts):
    cache = zeroed((2, 3, 96, 16, 3, 64), torch.bfloat16)  # 3.4 MiB
    resident, pages = _resident_pages(cache)
    assert resident < pages  # a fresh mapping: its pages come as they are touched
    thread = prefault(cache, parts=parts)
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert _resident_pages(cache) == (pages, pages)
    assert not bool(cache.any())
    cache[1, 2, 95, 15] = 2.0
    assert float(cache.float().sum()) == 2.0 * 3 * 64


@pytest.mark.skipif(platform.system() != "Linux", reason="madvise is Linux's")
def test_prefault_that_the_kernel_refuses_leaves_the_pages_to_the_steps(monkeypatch, caplog):
    monkeypatch.setattr(host_memory, "_MADV_POPULATE_WRITE", 12345)  # no such advice: EINVAL, as on Linux < 5.14
    cache = zeroed((2, 2, 64, 16, 3, 64), torch.float32)
    with caplog.at_level(logging.INFO, logger="engine.host_memory"):
        thread = prefault(cache)
        thread.join(timeout=120)
    assert "not faulted in ahead" in caplog.text
    cache[0, 1, 63] = 1.0  # the steps' own writes fault the pages in as before
    assert float(cache.sum()) == 16 * 3 * 64


def test_prefault_of_nothing():
    assert prefault(zeroed((2, 0, 16), torch.bfloat16)) is None


@pytest.mark.skipif(platform.system() != "Linux", reason="madvise(MADV_POPULATE_WRITE) and mincore are Linux's")
def test_an_engine_faults_its_kv_cache_in_only_when_asked(tiny_llama):
    from engine import LLM

    lazy = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4).llm_engine.model_runner
    assert lazy.kv_prefault is None and _resident_pages(lazy.kv_cache)[0] < _resident_pages(lazy.kv_cache)[1]
    runner = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, kv_prefault=True).llm_engine.model_runner
    runner.kv_prefault.join(timeout=120)
    resident, pages = _resident_pages(runner.kv_cache)
    assert resident == pages
