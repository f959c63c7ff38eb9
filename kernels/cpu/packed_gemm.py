"""The bf16 GEMM of ``packed_gemm.c`` (CPUs with AVX512-BF16) on a weight packed once into 32-column panels, for the
GEMM choice's ``packed`` path (``engine.models.gemm``). ``pack`` returns None where the kernel does not apply (no
build, no AVX512-BF16, another dtype, N not a multiple of 32 or K odd) and ``packed_gemm`` None for an x it does not
take: the caller multiplies another way."""

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from kernels.cpu import native

PANEL = 32  # packed_gemm.c's PANEL: N must be a multiple of it, K of 2
_P, _I = ctypes.c_void_p, ctypes.c_int64


def _library():
    library = native.load("packed_gemm")
    if library is not None and not getattr(library, "_typed", False):
        library.packed_gemm_available.restype = ctypes.c_int
        library.packed_gemm_pack.restype = ctypes.c_int
        library.packed_gemm_pack.argtypes = [_P, _I, _I, _P]
        library.packed_gemm.restype = ctypes.c_int
        library.packed_gemm.argtypes = [_P, _I, _P, _P, _I, _I, _P, _I]
        library._typed = True
    return library


@cache
def available() -> bool:
    """Whether this machine's build has the kernel (a C compiler and a CPU with AVX512-BF16)."""
    library = _library()
    return library is not None and library.packed_gemm_available() == 1


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight [N, K] in ``packed_gemm.c``'s panels ([N / 32][K / 2][32][2] bf16, flat)."""

    data: torch.Tensor
    n: int
    k: int


def pack(weight: torch.Tensor) -> PackedWeight | None:
    """``weight`` [N, K] bf16 packed for :func:`packed_gemm`, or None where the kernel cannot take it."""
    weight = weight.detach()
    if not (available() and weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2):
        return None
    n, k = weight.shape
    if n == 0 or k == 0 or n % PANEL or k % 2:
        return None
    weight = weight.contiguous()
    data = torch.empty(n * k, dtype=torch.bfloat16)
    if _library().packed_gemm_pack(weight.data_ptr(), n, k, data.data_ptr()) != 0:
        return None
    return PackedWeight(data, n, k)


def packed_gemm(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ W.T + bias`` for x [M, K] bf16 (contiguous) and bias [N] bf16 or None; None where they do not fit."""
    bias_fits = bias is None or (bias.dtype == torch.bfloat16 and bias.shape == (weight.n,) and bias.is_contiguous())
    if not (x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[0] >= 1 and x.shape[1] == weight.k
            and x.device.type == "cpu" and x.is_contiguous() and bias_fits):
        return None
    y = torch.empty(x.shape[0], weight.n, dtype=torch.bfloat16)
    status = _library().packed_gemm(x.data_ptr(), x.shape[0], weight.data.data_ptr(),
                                    None if bias is None else bias.data_ptr(), weight.n, weight.k, y.data_ptr(),
                                    torch.get_num_threads())
    return y if status == 0 else None


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The plain weight [N, K] back from its panels (for a caller that must multiply another way)."""
    n, k = weight.n, weight.k
    return weight.data.view(n // PANEL, k // 2, PANEL, 2).permute(0, 2, 1, 3).reshape(n, k)
