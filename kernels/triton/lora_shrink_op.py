"""LoRA shrink: ``h[t] = lora_a[token_slots[t]] @ x[t]`` for a batch whose tokens use different adapters.

Design (one kernel for prefill and decode, no sort, no host sync): the token axis is cut into tiles of ``BLOCK_M``
consecutive tokens, and a program loops over the distinct adapter slots present in its tile, running one
``tl.dot`` per slot on that slot's rows (the other rows load as zeros). A batch keeps each sequence's tokens
together, so a tile inside a prefill chunk holds one slot and is a plain GEMM tile (SGMV); a tile of decode tokens
holds a few slots and reads each slot's weights once per tile rather than once per token (BGMV reads them once per
token). Rows without an adapter (-1) are skipped and come out zero. Sorting tokens by slot (vLLM) would make every
tile single-slot but costs a sort per call or metadata the op signature does not carry; a scheduler that orders
its batch by adapter gets the same effect for free.

Mixed ranks: with ``slot_ranks`` ([slots] int32, optional) a slot of rank r reads only the first r rows of its
``lora_a`` and leaves the rest of ``h`` zero, instead of paying for ``max_rank`` (vLLM pads; S-LoRA does not).
Without it every slot is read to ``max_rank``; both agree when the padding rows are zero, as the slot cache keeps
them. Fused projections (q/k/v, gate/up) share ``x``: their A matrices stacked along the rank axis
(``[slots, num_slices * r_max, in]``) make one launch, ``num_slices`` telling where each slice's rank restarts.

Decode batches have few tiles, so the ``in_features`` reduction is split across programs (``SPLIT_K``) and summed
with atomic adds into a zeroed ``h`` (the order of those fp32 adds, hence the last bit, varies on GPUs).
"""

import torch
import triton
import triton.language as tl

from kernels.triton.launch import Launch, check_index, check_same_device, dot_precision, num_sms

# Configs, as data: "decode" for small batches, "prefill" otherwise; spill-free on sm_90, not yet GPU-tuned.
CONFIGS = {
    "decode": {"BLOCK_M": 16, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2},
    "prefill": {"BLOCK_M": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
}
DECODE_MAX_TOKENS = 256
MAX_BLOCK_R = 128  # stacked q/k/v at rank 64 make 192 rows: two tiles
PROGRAMS_PER_SM = 2


@triton.jit
def _lora_shrink_kernel(
    # tensors
    x_ptr, lora_a_ptr, token_slots_ptr, slot_ranks_ptr, h_ptr,
    # sizes
    num_tokens, in_features, max_rank, slice_rank,
    # strides
    stride_xt, stride_xk,
    stride_as, stride_ar, stride_ak,
    stride_ht, stride_hr,
    # tiling
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    # modes
    HAS_RANKS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_r = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < num_tokens
    slots = tl.load(token_slots_ptr + offs_m, mask=m_ok, other=-1)  # [BLOCK_M]
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xt

    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    pending = slots >= 0
    while tl.max(pending.to(tl.int32), 0) > 0:
        slot = tl.min(tl.where(pending, slots, 2**30), 0)  # next distinct slot of the tile
        rows = slots == slot
        pending = pending & (slots != slot)
        r_ok = offs_r < max_rank
        if HAS_RANKS:  # rows past the slot's rank, in each slice, are padding: never read
            r_ok = r_ok & (offs_r % slice_rank < tl.load(slot_ranks_ptr + slot))
        a_rows = lora_a_ptr + slot.to(tl.int64) * stride_as + offs_r[None, :] * stride_ar
        for k0 in range(pid_k * BLOCK_K, in_features, SPLIT_K * BLOCK_K):
            k = k0 + offs_k
            k_ok = k < in_features
            xk = tl.load(x_rows + k[None, :] * stride_xk, mask=rows[:, None] & k_ok[None, :], other=0.0)
            ak = tl.load(a_rows + k[:, None] * stride_ak, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
            acc = tl.dot(xk, ak, acc, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_R]

    h = h_ptr + offs_m[:, None] * stride_ht + offs_r[None, :] * stride_hr
    mask = m_ok[:, None] & (offs_r < max_rank)[None, :]
    if SPLIT_K == 1:
        tl.store(h, acc, mask=mask)
    else:
        tl.atomic_add(h, acc, mask=mask, sem="relaxed")  # a plain sum: no ordering needed


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, max_rank, in_features]; max_rank = num_slices * slice_rank
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32, rank of each slot's adapter
    num_slices: int = 1,
) -> torch.Tensor:  # [num_tokens, max_rank] float32
    """``h[t] = lora_a[token_slots[t]] @ x[t]`` in fp32; rows of tokens without an adapter are zero
    (see ``kernels.reference.lora_shrink``). ``slot_ranks`` lets a slot skip its zero padding rows, in each of
    the ``num_slices`` equal parts of the rank axis when the A matrices of a fused projection are stacked there."""
    _check(x, lora_a, token_slots, slot_ranks, num_slices)
    config = choose_config(x, lora_a)
    zero = config["SPLIT_K"] > 1 or x.shape[0] == 0
    h = (torch.zeros if zero else torch.empty)(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    for launch in plan(x, lora_a, token_slots, slot_ranks, h, config, num_slices):
        launch.run(x.device)
    return h


def choose_config(x: torch.Tensor, lora_a: torch.Tensor) -> dict:
    """Tiling from shapes alone, with enough K splits to occupy the GPU when the token tiles do not."""
    num_tokens, in_features = x.shape
    config = dict(CONFIGS["decode" if num_tokens <= DECODE_MAX_TOKENS else "prefill"])
    config["BLOCK_R"] = min(MAX_BLOCK_R, max(16, triton.next_power_of_2(lora_a.shape[1])))
    programs = triton.cdiv(num_tokens, config["BLOCK_M"]) * triton.cdiv(lora_a.shape[1], config["BLOCK_R"])
    k_chunks = triton.cdiv(in_features, config["BLOCK_K"])
    config["SPLIT_K"] = max(1, min(k_chunks, PROGRAMS_PER_SM * num_sms(x.device) // max(programs, 1)))
    return config


def plan(x, lora_a, token_slots, slot_ranks, h, config, num_slices=1) -> list[Launch]:
    """The launch that writes (``SPLIT_K`` == 1) or adds into (``SPLIT_K`` > 1, ``h`` zeroed) ``h``."""
    num_tokens, in_features = x.shape
    max_rank = lora_a.shape[1]
    return [Launch(
        _lora_shrink_kernel,
        grid=(triton.cdiv(num_tokens, config["BLOCK_M"]), triton.cdiv(max_rank, config["BLOCK_R"]),
              config["SPLIT_K"]),
        args=(x, lora_a, token_slots, token_slots if slot_ranks is None else slot_ranks, h,
              num_tokens, in_features, max_rank, max_rank // num_slices, *x.stride(), *lora_a.stride(),
              *h.stride()),
        constexprs=dict(BLOCK_M=config["BLOCK_M"], BLOCK_R=config["BLOCK_R"], BLOCK_K=config["BLOCK_K"],
                        SPLIT_K=config["SPLIT_K"], HAS_RANKS=slot_ranks is not None,
                        DOT_PRECISION=dot_precision(lora_a.dtype)),
        options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]),
    )]


def _check(x, lora_a, token_slots, slot_ranks, num_slices) -> None:
    tensors = dict(x=x, lora_a=lora_a, token_slots=token_slots)
    if slot_ranks is not None:
        tensors["slot_ranks"] = slot_ranks
    check_same_device(**tensors)
    if x.dim() != 2 or lora_a.dim() != 3 or lora_a.shape[2] != x.shape[1]:
        raise ValueError(f"x must be [tokens, in] and lora_a [slots, max_rank, in], "
                         f"got {list(x.shape)} and {list(lora_a.shape)}")
    if x.dtype != lora_a.dtype or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x and lora_a must share one of fp32/fp16/bf16, got {x.dtype} and {lora_a.dtype}")
    check_index("token_slots", token_slots, torch.int32, (x.shape[0],))
    if num_slices < 1 or lora_a.shape[1] % num_slices:
        raise ValueError(f"lora_a's rank axis ({lora_a.shape[1]}) does not split into {num_slices} slices")
    if slot_ranks is not None:
        check_index("slot_ranks", slot_ranks, torch.int32, (lora_a.shape[0],))
