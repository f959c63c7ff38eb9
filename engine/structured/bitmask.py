"""Token bitmasks: one int32 row per sequence, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed.

Both backends write this layout, so allocating and applying a mask does not depend on the backend.
"""

from collections.abc import Sequence

import torch
import xgrammar

ALL_ALLOWED = -1  # every bit set


def bitmask_width(vocab_size: int) -> int:
    """Words per row: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def allocate_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU bitmask that allows every token (the libraries fill masks on CPU)."""
    return torch.full((batch_size, bitmask_width(vocab_size)), ALL_ALLOWED, dtype=torch.int32)  # [batch, words]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Set to -inf, in place, the logits the mask disallows, in ``rows`` only (the constrained sequences; the
    others are not touched). Row i of the mask belongs to row i of the logits. The backends leave the bits past
    the vocabulary 0, and logits wider than the mask (a padded lm_head) are -inf past it: those ids are in no
    grammar.

    The kernel is xgrammar's for either backend: llguidance's own helper is a torch.compile graph, which on this
    CPU took 24 s to compile and 18 ms a call at batch 1 against 0.09 ms for xgrammar's C++ loop."""
    # logits: [batch, width] float32/bf16/fp16; bitmask: [>= batch, words] int32
    if not rows:
        return
    rows = list(rows)
    bitmask = bitmask.to(logits.device, non_blocking=True)
    covered = min(logits.shape[1], 32 * bitmask.shape[1])
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=covered, indices=rows)
    if logits.shape[1] > covered:
        logits[rows, covered:] = float("-inf")


def allow_only(bitmask: torch.Tensor, row: int, token_ids: Sequence[int]) -> None:
    """Make ``bitmask[row]`` allow exactly ``token_ids``."""
    # bitmask: [batch, words] int32
    bitmask[row].zero_()
    for token_id in token_ids:
        word, bit = divmod(token_id, 32)
        bitmask[row, word] |= (1 << bit) if bit < 31 else -(1 << 31)  # bit 31 is int32's sign bit


def clear_tail(bitmask: torch.Tensor, rows: Sequence[int], tail_bits: int | None) -> None:
    """Keep only ``tail_bits`` of the last word in ``rows`` (None: the vocabulary fills the last word)."""
    # bitmask: [batch, words] int32
    if tail_bits is not None:
        bitmask[rows, -1] &= tail_bits
