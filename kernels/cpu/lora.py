"""CPU path of the multi-LoRA ops: one GEMM per run of tokens sharing a slot, never one per token.

When each slot's tokens are (nearly) contiguous, as when the engine orders a step's sequences by adapter, the
GEMMs work on slices of ``x`` and ``y`` in place. Otherwise the rows are gathered once in slot order, multiplied
per slot, and scattered back once. The plan is the same for every layer and projection of a step, so it is
computed once and reused while ``token_slots`` holds the same values (a kept copy is compared: cheaper than
re-planning). Measured alternatives: ``torch.nn.functional.grouped_mm`` (needs 16-byte strides, pays for every
empty slot) and a padded ``bmm`` over all slots (faster only for interleaved small batches, wasteful with skewed
popularity) did not beat this on sorted batches (``python -m bench.lora_ops``).

Fused projections: the shrink of stacked A matrices is one GEMM per run whatever ``num_slices``; the expand loops
over the ``slices``' column views of ``y`` and ``lora_b``. ``slot_ranks`` is not used: the slot cache keeps the
padding past each rank zero, so it adds nothing but FLOPs (skipping it per slice would cost a call per slice).
"""

from dataclasses import dataclass

import torch

# A run beyond one per slot costs one more small GEMM; a gather plus a scatter cost about two.
_MAX_EXTRA_RUNS = 2


@dataclass(frozen=True, slots=True)
class _Plan:
    order: torch.Tensor | None  # [num_valid] int64 rows to gather in slot order; None: work on x and y in place
    sorted_slots: torch.Tensor | None  # [num_valid] int64: slot of each gathered row
    segments: tuple[tuple[int, int, int], ...]  # (slot, start, end): rows of x (in place) or of x[order]
    covers_all: bool  # every token has an adapter


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
    if len(runs) - len({slot for slot, _, _ in runs}) <= _MAX_EXTRA_RUNS:
        plan = _Plan(None, None, tuple(runs), covers_all)
    else:
        sorted_slots, order = torch.sort(slots, stable=True)
        num_none = int((slots < 0).sum())  # -1 sorts first
        order, sorted_slots = order[num_none:], sorted_slots[num_none:]
        values, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
        ends = counts.cumsum(0).tolist()
        segments = tuple((slot, end - count, end)
                         for slot, count, end in zip(values.tolist(), counts.tolist(), ends, strict=True))
        plan = _Plan(order, sorted_slots, segments, covers_all)
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
