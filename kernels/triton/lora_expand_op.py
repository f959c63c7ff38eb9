"""LoRA expand: ``y[t] += scales[s] * lora_b[s] @ h[t]`` with ``s = token_slots[t]``, in place.

Same tiling as ``lora_shrink`` (see ``lora_shrink_op``): tiles of consecutive tokens, one ``tl.dot`` per distinct
slot in the tile, so a prefill chunk is a grouped GEMM and decode tokens share each slot's weights within a tile.
``y`` may be a strided view (a column slice of a fused qkv output); only rows with an adapter are read and written,
so the others stay bit-for-bit untouched. ``scale * h`` is rounded to the weights' dtype for the tensor cores, as
vLLM and Punica do; products accumulate in fp32 and ``y`` is updated in fp32 before one rounding to its dtype.
With ``slot_ranks`` a slot of rank r reads only the first r columns of its ``lora_b``.

Fused projections take one launch: with ``slices=(576, 192, 192)`` (q/k/v) the output columns are cut into
slices, ``h`` holds one ``max_rank`` block of columns per slice (what ``lora_shrink`` of the stacked A matrices
gives) and slice i of ``y`` gets ``lora_b[s, slice i] @ h[t, block i]``. Output tiles never straddle two slices
(``BLOCK_N`` divides every slice size), so each tile reads one block of ``h``.
"""

import itertools
import math

import torch
import triton
import triton.language as tl

from kernels.triton.launch import Launch, check_index, check_same_device, dot_precision

# Configs, as data: "decode" for small batches, "prefill" otherwise; spill-free on sm_90, not yet GPU-tuned.
CONFIGS = {
    "decode": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "prefill": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3},  # 4 warps spill on sm_90
}
DECODE_MAX_TOKENS = 256
MAX_BLOCK_R = 64


@triton.jit
def _lora_expand_kernel(
    # tensors
    y_ptr, h_ptr, lora_b_ptr, token_slots_ptr, scales_ptr, slot_ranks_ptr,
    # sizes
    num_tokens, out_features, max_rank, slice_start_1, slice_start_2,
    # strides
    stride_yt, stride_yn,
    stride_ht, stride_hr, stride_h_slice,
    stride_bs, stride_bn, stride_br,
    # tiling
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    # modes
    HAS_RANKS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < num_tokens
    slots = tl.load(token_slots_ptr + offs_m, mask=m_ok, other=-1)  # [BLOCK_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < out_features
    offs_r = tl.arange(0, BLOCK_R)
    in_slice = (pid_n * BLOCK_N >= slice_start_1).to(tl.int32) + (pid_n * BLOCK_N >= slice_start_2).to(tl.int32)
    h_rows = h_ptr + offs_m.to(tl.int64)[:, None] * stride_ht + in_slice * stride_h_slice

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    has_adapter = slots >= 0
    pending = has_adapter
    while tl.max(pending.to(tl.int32), 0) > 0:
        slot = tl.min(tl.where(pending, slots, 2**30), 0)  # next distinct slot of the tile
        rows = slots == slot
        pending = pending & (slots != slot)
        rank = max_rank
        if HAS_RANKS:
            rank = tl.minimum(tl.load(slot_ranks_ptr + slot), max_rank)
        scale = tl.load(scales_ptr + slot)
        b_cols = lora_b_ptr + slot.to(tl.int64) * stride_bs + offs_n[None, :] * stride_bn
        for r0 in range(0, rank, BLOCK_R):
            r = r0 + offs_r
            r_ok = r < rank
            hr = tl.load(h_rows + r[None, :] * stride_hr, mask=rows[:, None] & r_ok[None, :], other=0.0)
            br = tl.load(b_cols + r[:, None] * stride_br, mask=r_ok[:, None] & n_ok[None, :], other=0.0)
            # the scale goes on h so one accumulator serves every slot (a second one spills at 64x128)
            hr = (hr.to(tl.float32) * scale).to(br.dtype)
            acc = tl.dot(hr, br, acc, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]

    y = y_ptr + offs_m.to(tl.int64)[:, None] * stride_yt + offs_n[None, :] * stride_yn
    mask = has_adapter[:, None] & n_ok[None, :]
    current = tl.load(y, mask=mask, other=0.0).to(tl.float32)
    tl.store(y, (current + acc).to(y_ptr.dtype.element_ty), mask=mask)


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place
    h: torch.Tensor,  # [num_tokens, num_slices * max_rank]
    lora_b: torch.Tensor,  # [num_slots, out_features, max_rank]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    scales: torch.Tensor,  # [num_slots] float32
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32, rank of each slot's adapter
    slices: tuple[int, ...] | None = None,  # output sizes of a fused projection's parts, summing to out_features
) -> None:
    """``y[t] += scales[s] * lora_b[s] @ h[t]`` with ``s = token_slots[t]``; tokens with -1 are untouched
    (see ``kernels.reference.lora_expand``). ``slot_ranks`` lets a slot skip its zero padding columns;
    ``slices`` applies it per part of a fused projection, slice i using columns ``i * max_rank`` on of ``h``."""
    slices = tuple(slices or (y.shape[1],))
    _check(y, h, lora_b, token_slots, scales, slot_ranks, slices)
    for launch in plan(y, h, lora_b, token_slots, scales, slot_ranks, choose_config(y, lora_b, slices), slices):
        launch.run(y.device)


def choose_config(y: torch.Tensor, lora_b: torch.Tensor, slices: tuple[int, ...] = ()) -> dict:
    """Tiling from shapes alone; ``BLOCK_N`` shrinks until it divides every slice."""
    config = dict(CONFIGS["decode" if y.shape[0] <= DECODE_MAX_TOKENS else "prefill"])
    config["BLOCK_R"] = min(MAX_BLOCK_R, max(16, triton.next_power_of_2(lora_b.shape[2])))
    if len(slices) > 1:
        config["BLOCK_N"] = min(config["BLOCK_N"], math.gcd(*slices) & -math.gcd(*slices))  # largest 2^k dividing
    return config


def plan(y, h, lora_b, token_slots, scales, slot_ranks, config, slices=None) -> list[Launch]:
    """The launch that adds the LoRA update into ``y``."""
    num_tokens, out_features = y.shape
    starts = [*itertools.accumulate(slices or (out_features,))][:-1] + [out_features] * 2  # slices 1 and 2 begin
    return [Launch(
        _lora_expand_kernel,
        grid=(triton.cdiv(num_tokens, config["BLOCK_M"]), triton.cdiv(out_features, config["BLOCK_N"])),
        args=(y, h, lora_b, token_slots, scales, token_slots if slot_ranks is None else slot_ranks,
              num_tokens, out_features, lora_b.shape[2], starts[0], starts[1], *y.stride(), *h.stride(),
              lora_b.shape[2] * h.stride(1), *lora_b.stride()),
        constexprs=dict(BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_R=config["BLOCK_R"],
                        HAS_RANKS=slot_ranks is not None, DOT_PRECISION=dot_precision(lora_b.dtype)),
        options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]),
    )]


def _check(y, h, lora_b, token_slots, scales, slot_ranks, slices) -> None:
    tensors = dict(y=y, h=h, lora_b=lora_b, token_slots=token_slots, scales=scales)
    if slot_ranks is not None:
        tensors["slot_ranks"] = slot_ranks
    check_same_device(**tensors)
    if y.dim() != 2 or h.dim() != 2 or lora_b.dim() != 3:
        raise ValueError(f"y must be [tokens, out], h [tokens, max_rank], lora_b [slots, out, max_rank], "
                         f"got {list(y.shape)}, {list(h.shape)}, {list(lora_b.shape)}")
    if (h.shape[0] != y.shape[0] or lora_b.shape[1] != y.shape[1]
            or len(slices) * lora_b.shape[2] != h.shape[1]):
        raise ValueError(f"shapes do not fit: y {list(y.shape)}, h {list(h.shape)}, lora_b {list(lora_b.shape)}, "
                         f"{len(slices)} slice(s)")
    if sum(slices) != y.shape[1] or len(slices) > 3 or min(slices) < 16 or math.gcd(*slices) % 16:
        raise ValueError(f"slices {list(slices)} must be 1 to 3 sizes, multiples of 16, summing to {y.shape[1]}")
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if any(t.dtype not in floats for t in (y, h, lora_b)):
        raise ValueError(f"y, h, lora_b must be fp32/fp16/bf16, got {y.dtype}, {h.dtype}, {lora_b.dtype}")
    check_index("token_slots", token_slots, torch.int32, (y.shape[0],))
    check_index("scales", scales, torch.float32, (lora_b.shape[0],))
    if slot_ranks is not None:
        check_index("slot_ranks", slot_ranks, torch.int32, (lora_b.shape[0],))
