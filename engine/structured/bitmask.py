"""Token bitmasks: one int32 row per sequence, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed.

Both backends write this layout, so allocating and applying a mask does not depend on the backend.
"""

import ctypes
from collections.abc import Sequence
from functools import cache

import torch
import xgrammar

from kernels.cpu import native

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

    On CPU, float32 logits (the sampler's) go through ``kernels/cpu/bitmask.c``: one pass over each row's words,
    an all-allowed word skipped, an all-refused one stored at once. Replaying 64 of the structured suite's
    constrained outputs on the 2-vCPU AMD EPYC VM (process CPU time per step, 32-64 rows live, other work on the
    cores): 0.8-0.9 ms, against 2.9-3.1 ms for the torch path below, and the sampler no longer copies the logits
    first (1.1-1.3 ms more).
    Without a C compiler (or for other dtypes), rows that allow few tokens are rebuilt from their allowed ids and
    the others go through xgrammar's C++ kernel, for either backend: llguidance's own helper is a torch.compile
    graph, which on the Intel VM took 24 s to compile and 18 ms a call at batch 1."""
    # logits: [batch, width] float32/bf16/fp16; bitmask: [>= batch, words] int32
    if not rows:
        return
    rows = list(rows)
    bitmask = bitmask.to(logits.device, non_blocking=True)
    if _apply_native(logits, bitmask, rows):
        return
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


def _apply_native(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> bool:
    """The C kernel's pass, when it applies (CPU, float32 rows of unit stride, a contiguous mask); False if not."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        return False
    library = _library()
    if library is None:
        return False
    bitmask = bitmask.contiguous()
    index = torch.tensor(rows, dtype=torch.int64)
    if index.min() < 0 or index.max() >= min(logits.shape[0], bitmask.shape[0]):
        raise IndexError(f"rows {rows} outside logits {tuple(logits.shape)} or bitmask {tuple(bitmask.shape)}")
    library.apply_token_bitmask(logits.data_ptr(), logits.stride(0), logits.shape[1], bitmask.data_ptr(),
                                bitmask.shape[1], index.data_ptr(), len(rows), torch.get_num_threads())
    return True


@cache
def _library():
    library = native.load("bitmask")
    if library is not None:
        library.apply_token_bitmask.restype = None
        library.apply_token_bitmask.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                                ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    return library


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
