"""The GEMVs of ``gemv.c`` (a projection of one to four tokens: float32 on any CPU, bf16 on a CPU with AVX512-BF16)
for the GEMM choice's ``gemv`` path (``engine.models.gemm``). ``gemv`` returns None where it does not apply (no
build, another dtype, more rows, shapes that are not multiples of its blocks): the caller multiplies another way."""

import ctypes
from functools import cache

import torch

from kernels.cpu import native

MAX_ROWS = 4  # gemv.c's MAX_ROWS
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


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ weight.T + bias`` ([M, K], [N, K], [N] or None; all float32 or all bf16) for M <= 4, or None."""
    if not (x.dtype == weight.dtype and x.dtype in (torch.float32, torch.bfloat16) and x.dim() == 2
            and 1 <= x.shape[0] <= MAX_ROWS and x.device.type == "cpu" and x.is_contiguous()
            and weight.is_contiguous() and x.shape[1] == weight.shape[1]
            and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))):
        return None
    library = _library()
    if library is None:
        return None
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    kernel = library.gemv_f32 if x.dtype == torch.float32 else library.gemv_bf16
    status = kernel(x.data_ptr(), x.shape[0], weight.data_ptr(), None if bias is None else bias.data_ptr(),
                    weight.shape[0], weight.shape[1], y.data_ptr(), torch.get_num_threads())
    return y if status == 0 else None


@cache
def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this machine's build multiplies ``dtype`` (a C compiler; for bf16, a CPU with AVX512-BF16)."""
    y = gemv(torch.ones(1, 32, dtype=dtype), torch.ones(16, 32, dtype=dtype), None)
    return y is not None and bool(torch.all(y == 32))
