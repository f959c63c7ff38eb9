"""The GEMVs of ``gemv.c`` (a projection of one to four tokens: float32 on any CPU, bf16 on a CPU with AVX512-BF16)
for the GEMM choice's ``gemv`` path (``engine.models.gemm``). ``gemv`` returns None where it does not apply (no
build, another dtype, more rows, shapes that are not multiples of its blocks): the caller multiplies another way."""

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from kernels.cpu import native

MAX_ROWS = 4  # gemv.c's MAX_ROWS
_MULTIPLES = {torch.float32: (8, 8), torch.bfloat16: (16, 32)}  # dtype -> what N and K must be multiples of
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _library():
    library = native.load("gemv")
    if library is not None and not getattr(library, "_typed", False):
        library.gemv_bf16.restype = ctypes.c_int
        library.gemv_bf16.argtypes = [_P, _I, _P, _P, _I, _I, _P, _I]
        library.gemv_f32.restype = ctypes.c_int
        library.gemv_f32.argtypes = [_P, _I, _P, _P, _I, _I, _P, _I]
        library._typed = True
    return library


@dataclass(frozen=True, slots=True)
class GemvWeight:
    """A weight [N, K] checked once for ``gemv.c`` (what a projection binds): contiguous, float32 or bf16, N and K
    the multiples its kernel takes; ``kernel`` the C function for its dtype."""

    weight: torch.Tensor
    kernel: object
    n: int
    k: int


def prepare(weight: torch.Tensor) -> GemvWeight | None:
    """``weight`` ready for :func:`gemv_prepared`, or None where ``gemv.c`` cannot multiply by it (or is not built)."""
    weight = weight.detach()
    if not (weight.dtype in _MULTIPLES and weight.device.type == "cpu" and weight.dim() == 2
            and weight.is_contiguous()):
        return None
    n, k = weight.shape
    rows, inner = _MULTIPLES[weight.dtype]
    library = _library()
    if library is None or n % rows or k % inner:
        return None
    return GemvWeight(weight, library.gemv_f32 if weight.dtype == torch.float32 else library.gemv_bf16, n, k)


def gemv_prepared(x: torch.Tensor, prepared: GemvWeight, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ weight.T + bias`` for x [M, K] of the weight's dtype, M <= 4; None where x or bias does not fit. The
    checks are on x alone: at a decode token they are a visible part of the call."""
    if not (x.dtype == prepared.weight.dtype and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS
            and x.shape[1] == prepared.k and x.device.type == "cpu" and x.is_contiguous()
            and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))):
        return None
    y = torch.empty(x.shape[0], prepared.n, dtype=x.dtype)
    status = prepared.kernel(x.data_ptr(), x.shape[0], prepared.weight.data_ptr(),
                             None if bias is None else bias.data_ptr(), prepared.n, prepared.k, y.data_ptr(),
                             torch.get_num_threads())
    return y if status == 0 else None


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ weight.T + bias`` ([M, K], [N, K], [N] or None; all float32 or all bf16) for M <= 4, or None."""
    prepared = prepare(weight)
    return None if prepared is None else gemv_prepared(x, prepared, bias)


@cache
def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this machine's build multiplies ``dtype`` (a C compiler; for bf16, a CPU with AVX512-BF16)."""
    y = gemv(torch.ones(1, 32, dtype=dtype), torch.ones(16, 32, dtype=dtype), None)
    return y is not None and bool(torch.all(y == 32))
