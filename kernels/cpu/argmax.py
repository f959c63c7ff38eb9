"""The C argmax of ``argmax.c`` over the rows of float32 CPU logits (greedy sampling): torch.argmax(dim=-1)'s answer,
first index of the largest value, NaN counted above everything. None where it does not apply (no C build, not a
contiguous float32 CPU [N, V] tensor with V >= 1): the caller runs torch's op."""

import ctypes

import torch

from kernels.cpu import native

_P, _I = ctypes.c_void_p, ctypes.c_int64


def _library():
    library = native.load("argmax")
    if library is not None and not getattr(library, "_typed", False):
        library.argmax_rows.restype = None
        library.argmax_rows.argtypes = [_P, _I, _I, _P, _I]
        library._typed = True
    return library


def argmax_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """``logits.argmax(dim=-1)`` ([N] int64) for ``logits`` [N, V] float32; None where it does not apply."""
    if not (logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() == 2
            and logits.shape[1] >= 1 and logits.is_contiguous()):
        return None
    library = _library()
    if library is None:
        return None
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    if logits.shape[0]:
        library.argmax_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], out.data_ptr(),
                            torch.get_num_threads())
    return out
