"""CPU path of the multi-LoRA ops: never one GEMM per token, and for decode-sized batches one call per projection.

The plan is computed from ``token_slots`` once per step (it is the same for every layer and projection of a step,
so it is kept and reused while ``token_slots`` holds the same values; a kept copy is compared: cheaper than
re-planning). Which path runs:

* **the C loop** (``kernels/cpu/lora.c``; activations and adapter weights both float32 or both bfloat16, float32
  sums; sizes multiples of 8; float32 batches up to 512 tokens with an adapter, bfloat16 ones of any size): up to
  four tokens of one slot a work item, each row of A or B they read loaded once for all of them, each h or y row
  written once. A decode step's LoRA is a few MFLOP per projection, and torch pays tens of microseconds per op
  around such small products: with 8 adapters at rank 16 on SmolLM2-135M (``bench.multi_lora --quick``), the LoRA
  ops of a 62-token decode step took about 60 ms in torch and 32 ms with the C loop. On CPUs with AMX-BF16, a bf16
  call's slots with many tokens run on tiles (the shrink from 16 tokens of a slot, the expand from 4): each such
  slot's A or B is packed once a call into the tiles' pair layout and serves all its tokens (gate|up, 8 slots, 2-core
  Sapphire Rapids VM: shrink at 2048 tokens 52 against 379 us, at 256 20 against 49; expand at 2048 586 against
  2639 us, at 64 48 against 90); h keeps float32 accuracy in the expand as a bf16 high and low part. In bfloat16
  the paths below convert every slice to float32 first, and lost to the C loop at every batch size (q|k|v's shrink
  and expand, 8 slots, Zen 4 VM: 70 against 941 us at 64 tokens, 1638 against 3000 at 2048); in float32 torch's
  GEMMs win from about 2048 tokens (1565 against 1902 us).
* **padded** (the same small batches when the C loop does not apply: float16, odd ranks, no compiler): every slot
  from the lowest to the highest one in use is a group of ``L`` rows (``L`` = the most tokens any slot has), the
  tokens gathered into them once, padding rows repeating a real row with a zero scale. Each op is one ``bmm``
  over the groups against a view of the slot buffers (no copy of any weight) and one scatter.
* **runs** (larger batches whose slots' tokens are contiguous, as when the engine orders a step's sequences by
  adapter): one GEMM per run on slices of ``x`` and ``y`` in place.
* **gathered** (larger batches in any order): the rows gathered once in slot order, one GEMM per slot, scattered
  back once.

Fused projections: the shrink of stacked A matrices is one GEMM (or bmm, or C call) whatever ``num_slices``; the
expand covers the ``slices``' column ranges of ``y`` and ``lora_b``. ``slot_ranks`` is not used: the slot cache
keeps the padding past each rank zero, so it adds nothing but FLOPs. Measured and not used:
``torch.nn.functional.grouped_mm`` (needs 16-byte strides, pays for every empty slot).
"""

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu import native

# A run beyond one per slot costs one more small GEMM; a gather plus a scatter cost about two.
_MAX_EXTRA_RUNS = 2


@dataclass(frozen=True, slots=True)
class _Padded:
    first_slot: int  # the groups are slots first_slot .. first_slot + groups - 1
    groups: int
    rows_per_group: int  # L
    gather: torch.Tensor | None  # [groups * L] int64 token row of each padded row; None: x itself, viewed
    positions: torch.Tensor | None  # [num_valid] int64 padded row of each token with an adapter
    rows: torch.Tensor | None  # [num_valid] int64 its token row
    row_slots: torch.Tensor | None  # [groups * L] int64 slot of each padded row
    row_valid: torch.Tensor | None  # [groups * L] float32: 1 for a token's row, 0 for padding


@dataclass(frozen=True, slots=True)
class _Plan:
    order: torch.Tensor | None  # [num_valid] int64 rows to gather in slot order; None: work on x and y in place
    sorted_slots: torch.Tensor | None  # [num_valid] int64: slot of each gathered row
    segments: tuple[tuple[int, int, int], ...]  # (slot, start, end): rows of x (in place) or of x[order]
    covers_all: bool  # every token has an adapter
    padded: _Padded | None = None  # the padded plan, when chosen (then order and segments are unused)
    native_rows: torch.Tensor | None = None  # [num_valid] int64 token rows with an adapter, in slot order
    native_slots: torch.Tensor | None = None  # [num_valid] int64 their slots (None: too many for the C path)
    max_slot: int = -1


# The padded plan, and the C path (kernels/cpu/lora.c) for float32, are taken for at most this many tokens with
# an adapter: past that, torch's GEMMs over runs of tokens beat them. bfloat16 takes the C path at any size.
_SMALL_BATCH = 512

# The padded plan is taken while its rows stay within _PAD_FACTOR times the tokens with an adapter (plus
# _PAD_SLACK): past that, its wasted FLOPs outweigh the calls it saves.
_PAD_FACTOR, _PAD_SLACK = 4, 256


_last_slots: torch.Tensor | None = None
_last_plan: _Plan | None = None


def _plan(token_slots: torch.Tensor) -> _Plan:
    global _last_slots, _last_plan
    last = _last_slots
    if last is not None and last.shape == token_slots.shape and torch.equal(last, token_slots):
        return _last_plan
    slots = token_slots.long()
    values, counts = torch.unique_consecutive(slots, return_counts=True)
    ends = counts.cumsum(0).tolist()
    runs = [(slot, end - count, end) for slot, count, end in zip(values.tolist(), counts.tolist(), ends, strict=True)
            if slot >= 0]
    covers_all = len(runs) == len(values)
    native_rows = native_slots = padded = None
    num_valid = sum(end - start for _, start, end in runs)
    if num_valid > 0:  # the token rows with an adapter in slot order, for the C loop and the padded plan
        native_rows = torch.nonzero(slots >= 0).squeeze(1)
        native_slots, order = torch.sort(slots.index_select(0, native_rows), stable=True)
        native_rows = native_rows.index_select(0, order)
        if num_valid <= _SMALL_BATCH:
            padded = _padded_plan(slots, runs, num_valid, native_rows, native_slots)
    extra = dict(native_rows=native_rows, native_slots=native_slots,
                 max_slot=max((slot for slot, _, _ in runs), default=-1))
    if padded is not None:
        plan = _Plan(None, None, (), covers_all, padded, **extra)
    elif len(runs) - len({slot for slot, _, _ in runs}) <= _MAX_EXTRA_RUNS:
        plan = _Plan(None, None, tuple(runs), covers_all, **extra)
    else:
        sorted_slots, order = torch.sort(slots, stable=True)
        num_none = int((slots < 0).sum())  # -1 sorts first
        order, sorted_slots = order[num_none:], sorted_slots[num_none:]
        values, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
        ends = counts.cumsum(0).tolist()
        segments = tuple((slot, end - count, end)
                         for slot, count, end in zip(values.tolist(), counts.tolist(), ends, strict=True))
        plan = _Plan(order, sorted_slots, segments, covers_all, **extra)
    _last_slots, _last_plan = token_slots.clone(), plan
    return plan


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, max_rank, in_features]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32; unused (see the module docstring)
    num_slices: int = 1,  # parts stacked on lora_a's rank axis; one GEMM covers them all
) -> torch.Tensor:  # [num_tokens, max_rank] float32
    plan = _plan(token_slots)
    num_tokens, max_rank = x.shape[0], lora_a.shape[1]
    if _takes_native(plan, x.dtype) and plan.max_slot < lora_a.shape[0]:
        h = _native_shrink(x, lora_a, plan)
        if h is not None:
            return h
    if plan.padded is not None:
        return _padded_shrink(x, lora_a, plan.padded, plan.covers_all)
    if plan.order is None:
        h = (torch.empty if plan.covers_all else torch.zeros)(num_tokens, max_rank, dtype=torch.float32)
        for slot, start, end in plan.segments:
            torch.mm(x[start:end].float(), lora_a[slot].float().t(), out=h[start:end])
        return h
    rows = x.index_select(0, plan.order).float()  # [num_valid, in]
    h_sorted = torch.empty(rows.shape[0], max_rank, dtype=torch.float32)  # [num_valid, max_rank]
    for slot, start, end in plan.segments:
        torch.mm(rows[start:end], lora_a[slot].float().t(), out=h_sorted[start:end])
    return torch.zeros(num_tokens, max_rank, dtype=torch.float32).index_copy_(0, plan.order, h_sorted)


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place (may be a column slice of a fused output)
    h: torch.Tensor,  # [num_tokens, num_slices * max_rank]
    lora_b: torch.Tensor,  # [num_slots, out_features, max_rank]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    scales: torch.Tensor,  # [num_slots] float32
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32; unused (see the module docstring)
    slices: tuple[int, ...] | None = None,  # output sizes of a fused projection's parts
) -> None:
    plan = _plan(token_slots)
    if _takes_native(plan, y.dtype) and plan.max_slot < lora_b.shape[0] and _native_expand(
            y, h, lora_b, scales, plan, slices or (y.shape[1],)):
        return
    if plan.padded is not None:
        _padded_expand(y, h, lora_b, scales, plan.padded, slices or (y.shape[1],))
        return
    if not plan.segments:
        return
    max_rank, offset = lora_b.shape[2], 0
    for i, size in enumerate(slices or (y.shape[1],)):
        part = slice(offset, offset + size)
        _expand(y[:, part], h[:, i * max_rank : (i + 1) * max_rank], lora_b[:, part], scales, plan)
        offset += size


def _expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor, plan: _Plan) -> None:
    """One part of the expand: ``y`` [T, out], ``h`` [T, max_rank], ``lora_b`` [slots, out, max_rank]."""
    if plan.order is None:
        scale_of = scales.tolist()
        for slot, start, end in plan.segments:
            if y.dtype == torch.float32:
                y[start:end].addmm_(h[start:end].float(), lora_b[slot].float().t(), alpha=scale_of[slot])
            else:
                y[start:end] += (h[start:end].float() @ lora_b[slot].float().t()).mul_(scale_of[slot]).to(y.dtype)
        return
    # Scaling the narrow h rather than the wide product costs max_rank, not out_features, per token.
    rows = h.index_select(0, plan.order).float() * scales.float().index_select(0, plan.sorted_slots)[:, None]
    delta = torch.empty(rows.shape[0], lora_b.shape[1], dtype=torch.float32)  # [num_valid, out]
    for slot, start, end in plan.segments:
        torch.mm(rows[start:end], lora_b[slot].float().t(), out=delta[start:end])
    y.index_add_(0, plan.order, delta.to(y.dtype))


def _padded_plan(slots: torch.Tensor, runs: list[tuple[int, int, int]], num_valid: int, rows: torch.Tensor,
                 row_slots: torch.Tensor) -> _Padded | None:
    """The padded plan for ``slots`` (int64, -1 = none) whose runs are ``runs`` and whose ``num_valid`` tokens with
    an adapter are ``rows`` of slots ``row_slots`` (in slot order), or None when it does not pay."""
    per_slot: dict[int, int] = {}
    for slot, start, end in runs:
        per_slot[slot] = per_slot.get(slot, 0) + end - start
    first, last = min(per_slot), max(per_slot)
    groups, length = last - first + 1, max(per_slot.values())
    if len(per_slot) < 2 or groups * length > _PAD_FACTOR * num_valid + _PAD_SLACK:
        return None
    if num_valid == slots.shape[0] and groups * length == num_valid and len(runs) == groups and all(
            slot == first + i and end - start == length for i, (slot, start, end) in enumerate(runs)):
        return _Padded(first, groups, length, None, None, None, None, None)  # x is already the padded layout
    sorted_slots = row_slots - first
    counts = torch.bincount(sorted_slots, minlength=groups)  # [groups]
    starts = counts.cumsum(0) - counts
    positions = sorted_slots * length + (torch.arange(num_valid) - starts.index_select(0, sorted_slots))
    gather = torch.full((groups * length,), int(rows[0]), dtype=torch.int64)  # padding repeats a real row
    gather.index_copy_(0, positions, rows)
    row_slots = torch.arange(first, first + groups).repeat_interleave(length)
    row_valid = torch.zeros(groups * length).index_fill_(0, positions, 1.0)
    return _Padded(first, groups, length, gather, positions, rows, row_slots, row_valid)


def _padded_rows(t: torch.Tensor, padded: _Padded) -> torch.Tensor:
    """``t`` [num_tokens, d] in the padded layout [groups, L, d], fp32."""
    if padded.gather is None:
        return t.float().reshape(padded.groups, padded.rows_per_group, t.shape[1])
    return t.index_select(0, padded.gather).float().view(padded.groups, padded.rows_per_group, t.shape[1])


def _padded_shrink(x: torch.Tensor, lora_a: torch.Tensor, padded: _Padded, covers_all: bool) -> torch.Tensor:
    groups = slice(padded.first_slot, padded.first_slot + padded.groups)
    h = torch.bmm(_padded_rows(x, padded), lora_a[groups].float().transpose(1, 2))  # [groups, L, max_rank]
    flat = h.view(-1, h.shape[2])
    if padded.gather is None:
        return flat
    out = (torch.empty if covers_all else torch.zeros)(x.shape[0], h.shape[2], dtype=torch.float32)
    return out.index_copy_(0, padded.rows, flat.index_select(0, padded.positions))


def _padded_expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor, padded: _Padded,
                   slices: tuple[int, ...]) -> None:
    groups = slice(padded.first_slot, padded.first_slot + padded.groups)
    # Each padded row scaled by its slot's scale, padding by 0: its products are then zero and can be added back
    # with the rest in one scatter (to the real row the padding repeats). Scaling the narrow h rather than the
    # wide product costs max_rank, not out_features, per row.
    if padded.gather is None:
        hp = _padded_rows(h, padded) * scales[groups].float()[:, None, None]
    else:
        row_scales = scales.float().index_select(0, padded.row_slots).mul_(padded.row_valid)
        hp = _padded_rows(h, padded) * row_scales.view(padded.groups, padded.rows_per_group, 1)
    max_rank, offset, deltas = lora_b.shape[2], 0, []
    for i, size in enumerate(slices):
        deltas.append(torch.bmm(hp[:, :, i * max_rank:(i + 1) * max_rank],
                                lora_b[groups, offset:offset + size].float().transpose(1, 2)))  # [groups, L, size]
        offset += size
    # One update of y for all the parts: a scatter into column slices of y costs several times one into y.
    delta = (deltas[0] if len(deltas) == 1 else torch.cat(deltas, dim=2)).view(-1, offset).to(y.dtype)
    if padded.gather is None:
        y += delta
    else:
        y.index_add_(0, padded.gather, delta)


_SIZES: dict[tuple[int, ...], torch.Tensor] = {}


_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def _library(dtype: torch.dtype):
    """The C loop for activations and adapter weights of ``dtype`` (float32 unless built with -DACT_BF16)."""
    library = native.load("lora", ("ACT_BF16",) if dtype == torch.bfloat16 else ())
    if library is not None and not getattr(library, "_typed", False):
        library.lora_shrink.restype = ctypes.c_int
        library.lora_shrink.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_void_p, ctypes.c_int64])
        library.lora_expand.restype = ctypes.c_int
        library.lora_expand.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                             ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_int64, ctypes.c_int64])
        library._typed = True
    return library


def _takes_native(plan: _Plan, dtype: torch.dtype) -> bool:
    return plan.native_rows is not None and (dtype == torch.bfloat16 or plan.native_rows.shape[0] <= _SMALL_BATCH)


def _native_shrink(x: torch.Tensor, lora_a: torch.Tensor, plan: _Plan) -> torch.Tensor | None:
    """h by the C loop, or None when it does not apply (dtype, layout, sizes not multiples of 8)."""
    if x.dtype not in _NATIVE_DTYPES or lora_a.dtype != x.dtype or not lora_a.is_contiguous() or x.stride(1) != 1:
        return None
    if x.dim() != 2 or lora_a.dim() != 3 or x.shape[1] != lora_a.shape[2]:
        raise ValueError(f"lora_shrink: x {tuple(x.shape)} does not fit lora_a {tuple(lora_a.shape)}")
    library = _library(x.dtype)
    if library is None:
        return None
    rank_total = lora_a.shape[1]
    h = (torch.empty if plan.covers_all else torch.zeros)(x.shape[0], rank_total, dtype=torch.float32)
    status = library.lora_shrink(x.data_ptr(), x.stride(0), lora_a.data_ptr(), x.shape[1], rank_total,
                                     plan.native_rows.data_ptr(), plan.native_slots.data_ptr(),
                                     plan.native_rows.shape[0], h.data_ptr(), torch.get_num_threads())
    return h if status == 0 else None


def _native_expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, scales: torch.Tensor, plan: _Plan,
                   slices: tuple[int, ...]) -> bool:
    """The expand by the C loop; False (nothing written) when it does not apply."""
    if not (y.dtype in _NATIVE_DTYPES and lora_b.dtype == y.dtype and h.dtype == torch.float32
            and y.stride(1) == 1 and h.stride(1) == 1 and lora_b.is_contiguous()):
        return False
    if (y.dim() != 2 or h.dim() != 2 or lora_b.dim() != 3 or y.shape[0] != h.shape[0]
            or sum(slices) != lora_b.shape[1] or h.shape[1] < len(slices) * lora_b.shape[2]
            or scales.shape[0] < lora_b.shape[0]):
        raise ValueError(f"lora_expand: y {tuple(y.shape)}, h {tuple(h.shape)}, lora_b {tuple(lora_b.shape)}, "
                         f"scales {tuple(scales.shape)} and slices {slices} do not fit together")
    library = _library(y.dtype)
    if library is None:
        return False
    scales = scales.float().contiguous()
    sizes = _SIZES.get(slices)
    if sizes is None:
        sizes = _SIZES[slices] = torch.tensor(slices, dtype=torch.int64)  # a model has a few shapes
    status = library.lora_expand(y.data_ptr(), y.stride(0), h.data_ptr(), h.stride(0), lora_b.data_ptr(),
                                     lora_b.shape[1], lora_b.shape[2], sizes.data_ptr(), len(slices),
                                     scales.data_ptr(), plan.native_rows.data_ptr(), plan.native_slots.data_ptr(),
                                     plan.native_rows.shape[0], torch.get_num_threads())
    return status == 0
