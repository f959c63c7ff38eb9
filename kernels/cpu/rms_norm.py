"""The C RMSNorm (with the residual add before it) of ``rms_norm.c``, for bfloat16 and float32 on CPU.

It returns None where the C build is missing or a tensor is not a contiguous bfloat16 or float32 CPU tensor of the
expected shape, and the caller runs torch's op. The results agree with torch's to one bfloat16 unit in the last
place, rarely, in bfloat16, and to a few float32 units in float32 (the sum of squares in another order; the residual
add is torch's exactly in both: ``rms_norm.c``).
"""

import ctypes

import torch

from kernels.cpu import native

_P, _I = ctypes.c_void_p, ctypes.c_int64


_VARIANTS = {torch.bfloat16: ("ACT_BF16",), torch.float32: ()}


def _library(dtype: torch.dtype):
    library = native.load("rms_norm", _VARIANTS[dtype])
    if library is not None and not getattr(library, "_typed", False):
        library.add_rms_norm.restype = None
        library.add_rms_norm.argtypes = [_P, _P, _P, _P, _I, _I, ctypes.c_float, _I]
        library._typed = True
    return library


def _fits(x: torch.Tensor) -> bool:
    return x.dtype in _VARIANTS and x.device.type == "cpu" and x.dim() == 2 and x.is_contiguous()


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``rms_norm(x)`` ([T, hidden]), after ``x += delta`` in place when ``delta`` is given; None where it does not
    apply (nothing changed then)."""
    if not (_fits(x) and weight.dtype == x.dtype and weight.is_contiguous() and weight.shape == x.shape[1:]
            and (delta is None or (_fits(delta) and delta.dtype == x.dtype and delta.shape == x.shape))):
        return None
    library = _library(x.dtype)
    if library is None:
        return None
    out = torch.empty_like(x)
    library.add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                         out.data_ptr(), x.shape[0], x.shape[1], eps, torch.get_num_threads())
    return out
