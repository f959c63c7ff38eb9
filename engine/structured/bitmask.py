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

    Most grammar positions allow a few tokens (JSON punctuation, an enum, digits): on CPU such rows are rebuilt
    from their allowed ids (3.5 ms for 64 rows of 50 allowed tokens here, against 12 ms through the dense
    kernel, which tests every bit). Rows that allow much go through xgrammar's C++ kernel, for either backend:
    llguidance's own helper is a torch.compile graph, which on this CPU took 24 s to compile and 18 ms a call at
    batch 1."""
    # logits: [batch, width] float32/bf16/fp16; bitmask: [>= batch, words] int32
    if not rows:
        return
    rows = list(rows)
    bitmask = bitmask.to(logits.device, non_blocking=True)
    covered = min(logits.shape[1], 32 * bitmask.shape[1])
    dense = rows
    if logits.device.type == "cpu":
        words = bitmask[rows]  # [num_rows, words]
        few = ((words != 0).sum(dim=1) <= bitmask.shape[1] // _SPARSE_WORDS_SHARE).tolist()
        sparse = [row for row, is_sparse in zip(rows, few, strict=True) if is_sparse]
        dense = [row for row, is_sparse in zip(rows, few, strict=True) if not is_sparse]
        if sparse:
            _apply_sparse(logits, bitmask, sparse)
    if dense:
        xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=covered, indices=dense)
    if logits.shape[1] > covered:
        logits[rows, covered:] = float("-inf")


_SPARSE_WORDS_SHARE = 4  # a row with at most a quarter of its words non-zero is rebuilt from its allowed ids
_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def _apply_sparse(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    index = torch.tensor(rows)
    words = bitmask[index]  # [num_rows, words]
    row, word = words.nonzero(as_tuple=True)  # the non-zero words
    bits = (words[row, word].unsqueeze(-1) >> _BIT_SHIFTS) & 1  # [num_nonzero_words, 32]
    nth, bit = bits.nonzero(as_tuple=True)
    row, token = row[nth], word[nth] * 32 + bit  # every allowed (row, token id)
    inside = token < logits.shape[1]
    row, token = row[inside], token[inside]
    kept = logits[index[row], token]
    logits[index] = float("-inf")
    logits[index[row], token] = kept


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
