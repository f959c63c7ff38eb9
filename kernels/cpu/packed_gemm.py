"""The GEMMs of ``packed_gemm.c`` on a weight packed once into 32-column panels, for the GEMM choice's ``packed`` path
(``engine.models.gemm``): bf16 on CPUs with AVX512-BF16, float32 on CPUs with AVX-512 or AVX2 + FMA, and for the
``widened`` path bf16 on FMAs (the same bf16 panels widened to float32 in registers) on CPUs with AVX-512F. ``pack``
returns None where the kernel does not apply (no build, no such CPU, another dtype, N not a multiple of 32, an odd
K in bf16) and ``packed_gemm`` None for an x it does not take: the caller multiplies another way."""

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from kernels.cpu import native

PANEL = 32  # packed_gemm.c's PANEL: N must be a multiple of it
_P, _I = ctypes.c_void_p, ctypes.c_int64


# dtype -> the C functions' suffix and what K must be a multiple of (bf16 takes the inner dimension in pairs)
_KINDS = {torch.bfloat16: ("", 2), torch.float32: ("_f32", 1)}


def _library():
    library = native.load("packed_gemm")
    if library is not None and not getattr(library, "_typed", False):
        for suffix, _ in _KINDS.values():
            getattr(library, f"packed_gemm{suffix}_available").restype = ctypes.c_int
            getattr(library, f"packed_gemm_pack{suffix}").restype = ctypes.c_int
            getattr(library, f"packed_gemm_pack{suffix}").argtypes = [_P, _I, _I, _P]
            getattr(library, f"packed_gemm{suffix}").restype = ctypes.c_int
            getattr(library, f"packed_gemm{suffix}").argtypes = [_P, _I, _P, _P, _I, _I, _P, _I]
        library.packed_gemm_widened_available.restype = ctypes.c_int
        library.packed_gemm_widened.restype = ctypes.c_int
        library.packed_gemm_widened.argtypes = [_P, _I, _P, _P, _I, _I, _P, _I]
        library._typed = True
    return library


@cache
def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this machine's build has the kernel for ``dtype`` (a C compiler; a CPU with AVX512-BF16 for bf16,
    with AVX-512, or AVX2 and FMA, for float32)."""
    library = _library()
    return (dtype in _KINDS and library is not None
            and getattr(library, f"packed_gemm{_KINDS[dtype][0]}_available")() == 1)


@cache
def available_widened() -> bool:
    """Whether this machine's build has the bf16 kernel on FMAs (``packed_gemm_widened``: AVX-512F, with or without
    AVX512-BF16): the bf16 panels widened to float32 in registers, for CPUs where vdpbf16ps is slow or absent."""
    library = _library()
    return library is not None and library.packed_gemm_widened_available() == 1


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight [N, K] in ``packed_gemm.c``'s panels (flat: bf16 [N / 32][K / 2][32][2], float32 [N / 32][K][32])."""

    data: torch.Tensor
    n: int
    k: int
    kernel: object  # the C function for its dtype


def pack(weight: torch.Tensor, widened: bool = False) -> PackedWeight | None:
    """``weight`` [N, K] (bf16 or float32) packed for :func:`packed_gemm`, or None where the kernel cannot take it.
    ``widened``: a bf16 weight for the kernel on FMAs (the same panels) instead of the one on vdpbf16ps."""
    weight = weight.detach()
    usable = (weight.dtype == torch.bfloat16 and available_widened()) if widened else available(weight.dtype)
    if not (usable and weight.device.type == "cpu" and weight.dim() == 2):
        return None
    n, k = weight.shape
    suffix, k_multiple = _KINDS[weight.dtype]
    if n == 0 or k == 0 or n % PANEL or k % k_multiple:
        return None
    weight = weight.contiguous()
    data = torch.empty(n * k, dtype=weight.dtype)
    library = _library()
    if getattr(library, f"packed_gemm_pack{suffix}")(weight.data_ptr(), n, k, data.data_ptr()) != 0:
        return None
    kernel = library.packed_gemm_widened if widened else getattr(library, f"packed_gemm{suffix}")
    return PackedWeight(data, n, k, kernel)


def packed_gemm(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ W.T + bias`` for x [M, K] (contiguous) and bias [N] or None, both of the weight's dtype; None where they
    do not fit."""
    dtype = weight.data.dtype
    bias_fits = bias is None or (bias.dtype == dtype and bias.shape == (weight.n,) and bias.is_contiguous())
    if not (x.dtype == dtype and x.dim() == 2 and x.shape[0] >= 1 and x.shape[1] == weight.k
            and x.device.type == "cpu" and x.is_contiguous() and bias_fits):
        return None
    y = torch.empty(x.shape[0], weight.n, dtype=dtype)
    status = weight.kernel(x.data_ptr(), x.shape[0], weight.data.data_ptr(), None if bias is None else bias.data_ptr(),
                           weight.n, weight.k, y.data_ptr(), torch.get_num_threads())
    return y if status == 0 else None


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The plain weight [N, K] back from its panels (for a caller that must multiply another way)."""
    n, k = weight.n, weight.k
    if weight.data.dtype == torch.float32:
        return weight.data.view(n // PANEL, k, PANEL).permute(0, 2, 1).reshape(n, k)
    return weight.data.view(n // PANEL, k // 2, PANEL, 2).permute(0, 2, 1, 3).reshape(n, k)
