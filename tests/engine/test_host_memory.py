"""glibc's malloc thresholds are raised for CPU engines (freed activations stay in the heap); the KV cache's zeroed
mapping."""

import gc
import platform

import pytest
import torch

from engine.host_memory import keep_freed_memory, zeroed


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
