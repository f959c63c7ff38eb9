"""Triton KV write against ``kernels.reference.write_kv`` under the interpreter: exact, slots -1 skipped."""

import pytest
import torch

from kernels import reference
from kernels.triton import write_kv

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 3, 64, 16, 4


def caches(dtype=torch.float32):
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM).to(dtype)
    return k_cache, torch.randn_like(k_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter_matches_reference_and_skips_minus_one(dtype):
    # slots at block starts and ends, across blocks, and two tokens to skip
    slot_mapping = torch.tensor([0, 15, 16, -1, 63, 37, -1], dtype=torch.int64)
    k = torch.randn(7, NUM_KV_HEADS, HEAD_DIM).to(dtype)
    v = torch.randn(7, NUM_KV_HEADS, HEAD_DIM).to(dtype)
    k_cache, v_cache = caches(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    reference.write_kv(k, v, k_ref, v_ref, slot_mapping)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_strided_views_of_fused_qkv():
    qkv = torch.randn(5, (9 + 2 * NUM_KV_HEADS) * HEAD_DIM)
    k = qkv[:, 9 * HEAD_DIM:12 * HEAD_DIM].view(5, NUM_KV_HEADS, HEAD_DIM)
    v = qkv[:, 12 * HEAD_DIM:].view(5, NUM_KV_HEADS, HEAD_DIM)
    slot_mapping = torch.tensor([5, 6, 7, 8, 40], dtype=torch.int64)
    k_cache, v_cache = caches()
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    assert torch.equal(k_cache[2, 8], k[4]) and torch.equal(v_cache[0, 5], v[0])


def test_empty_batch_changes_nothing():
    k_cache, v_cache = caches()
    before = k_cache.clone()
    empty = torch.zeros(0, NUM_KV_HEADS, HEAD_DIM)
    write_kv(empty, empty, k_cache, v_cache, torch.zeros(0, dtype=torch.int64))
    assert torch.equal(k_cache, before)


def test_bad_inputs_raise_value_error():
    k_cache, v_cache = caches()
    k = torch.randn(2, NUM_KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="slot_mapping must be torch.int64"):
        write_kv(k, k, k_cache, v_cache, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="heads/dim"):
        write_kv(k[:, :2], k[:, :2], k_cache, v_cache, torch.zeros(2, dtype=torch.int64))
