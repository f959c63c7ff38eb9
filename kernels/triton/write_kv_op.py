"""KV write: scatter this step's new keys and values into their paged-cache slots.

One program per token copies its ``num_kv_heads * head_dim`` keys and values (a few hundred bytes, so one warp);
a token whose slot is -1 (padding, or a position whose KV is already cached) is skipped.
"""

import torch
import triton
import triton.language as tl

from kernels.triton.launch import Launch, check_index, check_same_device

CONFIG = {"num_warps": 1}


@triton.jit
def _write_kv_kernel(
    # tensors
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    # strides
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    # model shape
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    # tiling
    HEADS_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block = slot // PAGE_SIZE
    in_block = slot % PAGE_SIZE
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HEAD_DIM_PAD)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)  # [HEADS_PAD, HEAD_DIM_PAD]
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + in_block * stride_kcs + heads * stride_kch + dims * stride_kcd
    v_dst = v_cache_ptr + block * stride_vcb + in_block * stride_vcs + heads * stride_vch + dims * stride_vcd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    """Scatter this step's new keys and values into their cache slots, in place (see ``kernels.reference``).
    ``k``/``v`` may be strided views (e.g. of a fused qkv output)."""
    _check(k, v, k_cache, v_cache, slot_mapping)
    for launch in plan(k, v, k_cache, v_cache, slot_mapping):
        launch.run(k.device)


def plan(k, v, k_cache, v_cache, slot_mapping) -> list[Launch]:
    """The launch that performs the write."""
    num_tokens, num_kv_heads, head_dim = k.shape
    return [Launch(
        _write_kv_kernel,
        grid=(num_tokens,),
        args=(k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride()),
        constexprs=dict(NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, PAGE_SIZE=k_cache.shape[1],
                        HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM_PAD=triton.next_power_of_2(head_dim)),
        options=dict(CONFIG),
    )]


def _check(k, v, k_cache, v_cache, slot_mapping) -> None:
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"k and v must both be [tokens, kv_heads, dim], got {list(k.shape)} and {list(v.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [blocks, block_size, kv_heads, dim], "
                         f"got {list(k_cache.shape)} and {list(v_cache.shape)}")
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"k heads/dim {list(k.shape[1:])} != cache heads/dim {list(k_cache.shape[2:])}")
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if any(t.dtype not in floats for t in (k, v, k_cache, v_cache)):
        raise ValueError(f"k, v and the caches must be fp32/fp16/bf16, got "
                         f"{k.dtype}, {v.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check_index("slot_mapping", slot_mapping, torch.int64, (k.shape[0],))
