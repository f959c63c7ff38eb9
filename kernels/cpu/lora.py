"""CPU path of the multi-LoRA ops: tokens grouped by slot, one GEMM per (slot, op) instead of one per token.

The grouping (a sort of ``token_slots``) is the same for every layer and projection of a step, so it is computed
once and reused while ``token_slots`` holds the same values (a copy of the last one is kept to compare).
A group whose tokens are consecutive is a slice (a view, no gather); otherwise its rows are gathered.
"""

import torch

_last_slots: torch.Tensor | None = None
_last_groups: list[tuple[int, slice | torch.Tensor]] = []


def _slot_groups(token_slots: torch.Tensor) -> list[tuple[int, slice | torch.Tensor]]:
    """``[(slot, rows)]`` for every slot >= 0 in use; ``rows`` is a slice or an int64 index tensor."""
    global _last_slots, _last_groups
    last = _last_slots
    if last is not None and last.shape == token_slots.shape and torch.equal(last, token_slots):
        return _last_groups
    sorted_slots, order = torch.sort(token_slots, stable=True)
    slots, counts = torch.unique_consecutive(sorted_slots, return_counts=True)
    groups, start = [], 0
    for slot, count in zip(slots.tolist(), counts.tolist(), strict=True):
        if slot >= 0:
            rows = order[start : start + count]
            first, last_row = int(rows[0]), int(rows[-1])
            groups.append((slot, slice(first, first + count) if last_row - first == count - 1 else rows))
        start += count
    _last_groups, _last_slots = groups, token_slots.clone()
    return groups


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, max_rank, in_features]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
) -> torch.Tensor:  # [num_tokens, max_rank] float32
    groups = _slot_groups(token_slots)
    num_tokens, max_rank = x.shape[0], lora_a.shape[1]
    covered = sum(_group_size(rows) for _, rows in groups)
    h = (torch.empty if covered == num_tokens else torch.zeros)(num_tokens, max_rank, dtype=torch.float32)
    for slot, rows in groups:
        a = lora_a[slot].float()  # [max_rank, in]
        if isinstance(rows, slice):
            torch.mm(x[rows].float(), a.t(), out=h[rows])
        else:
            h.index_copy_(0, rows, x.index_select(0, rows).float() @ a.t())
    return h


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place (may be a column slice of a fused output)
    h: torch.Tensor,  # [num_tokens, max_rank]
    lora_b: torch.Tensor,  # [num_slots, out_features, max_rank]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    scales: torch.Tensor,  # [num_slots] float32
) -> None:
    groups = _slot_groups(token_slots)
    if not groups:
        return
    scale_of = scales.tolist()
    fused = y.dtype == h.dtype == lora_b.dtype == torch.float32
    for slot, rows in groups:
        b, scale = lora_b[slot], scale_of[slot]  # [out, max_rank]
        h_rows = h[rows] if isinstance(rows, slice) else h.index_select(0, rows)
        if fused and isinstance(rows, slice):
            y[rows].addmm_(h_rows, b.t(), alpha=scale)
            continue
        delta = torch.mm(h_rows.float(), b.float().t()).mul_(scale).to(y.dtype)  # [rows, out]
        if isinstance(rows, slice):
            y[rows] += delta
        else:
            y.index_add_(0, rows, delta)


def _group_size(rows: slice | torch.Tensor) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else rows.numel()
