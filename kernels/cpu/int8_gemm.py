"""The int8 GEMM of ``int8_gemm.c`` (an int8 weight per output channel against activations quantized at every call
in groups of 64 inputs per token, int32 dot products on AVX512-VNNI (or AVX2's vpmaddubsw), on AMX-INT8 tiles from
16 rows where the CPU has them), for the GEMM choice's ``w8a8g`` path
(``engine.models.quant``). ``pack`` returns None where the kernel does not apply (no build, no such CPU, N not a
multiple of 32, K not of 64) and ``int8_gemm`` None for an x it does not take: the caller multiplies another way."""

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from kernels.cpu import native

PANEL, GROUP = 32, 64  # int8_gemm.c's PANEL and GROUP: N and K must be multiples of them
_P, _I = ctypes.c_void_p, ctypes.c_int64
_DTYPES = (torch.bfloat16, torch.float32)


def _library():
    library = native.load("int8_gemm")
    if library is not None and not getattr(library, "_typed", False):
        library.int8_gemm_available.restype = ctypes.c_int
        library.int8_gemm_amx.restype = ctypes.c_int
        library.int8_gemm_pack.restype = ctypes.c_int
        library.int8_gemm_pack.argtypes = [_P, _I, _I, _P]
        library.int8_gemm.restype = ctypes.c_int
        library.int8_gemm.argtypes = [_P, _I, ctypes.c_int, _P, _P, _P, _I, _I, _P, _I]
        library._typed = True
    return library


@cache
def available() -> bool:
    """Whether this machine's build has the kernel (a C compiler and a CPU with AVX512-VNNI and AVX512-BW, or
    with AVX2 and FMA)."""
    library = _library()
    return library is not None and library.int8_gemm_available() == 1


@cache
def amx() -> bool:
    """Whether calls of 16 rows and more run on AMX-INT8 tiles (the build has them and the OS grants the state)."""
    return available() and _library().int8_gemm_amx() == 1


@dataclass(frozen=True, slots=True)
class Int8Packed:
    """An int8 weight [N, K] in ``int8_gemm.c``'s panels (flat uint8 [N / 32][K / 4][32][4], values + 128) and its
    per-output-channel scales [N] (float32)."""

    data: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int


def pack(qweight: torch.Tensor, scales: torch.Tensor) -> Int8Packed | None:
    """``qweight`` [N, K] int8 with ``scales`` [N] (``w ~= qweight * scales[:, None]``) packed for
    :func:`int8_gemm`, or None where the kernel cannot take it."""
    if not (available() and qweight.dtype == torch.int8 and qweight.dim() == 2 and qweight.device.type == "cpu"):
        return None
    n, k = qweight.shape
    if n == 0 or k == 0 or n % PANEL or k % GROUP or scales.shape != (n,):
        return None
    qweight = qweight.contiguous()
    data = torch.empty(n * k, dtype=torch.uint8)
    if _library().int8_gemm_pack(qweight.data_ptr(), n, k, data.data_ptr()) != 0:
        return None
    return Int8Packed(data, scales.detach().float().contiguous(), n, k)


def int8_gemm(x: torch.Tensor, weight: Int8Packed, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ W.T + bias`` for x [M, K] (bf16 or float32, contiguous) and bias [N] or None, in x's dtype; None where
    they do not fit."""
    if not (x.dtype in _DTYPES and x.dim() == 2 and x.shape[0] >= 1 and x.shape[1] == weight.k
            and x.device.type == "cpu" and x.is_contiguous()):
        return None
    if bias is not None:
        if bias.shape != (weight.n,):
            return None
        bias = bias.detach().float().contiguous()
    y = torch.empty(x.shape[0], weight.n, dtype=x.dtype)
    status = _library().int8_gemm(x.data_ptr(), x.shape[0], int(x.dtype == torch.bfloat16), weight.data.data_ptr(),
                                  weight.scales.data_ptr(), None if bias is None else bias.data_ptr(), weight.n,
                                  weight.k, y.data_ptr(), torch.get_num_threads())
    return y if status == 0 else None


def reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What :func:`int8_gemm` computes, in torch: each row of x in groups of 64 to -127..127 as the kernel rounds
    them (float32: x * (127 / the group's amax), to nearest even; scale amax / 127), times the int8 weight and the
    weight's scales with float64 sums, not rounded to x's dtype; for the tests."""
    m, k = x.shape
    groups = x.float().view(m, k // GROUP, GROUP)
    top = groups.abs().amax(-1, keepdim=True)
    xq = (groups * torch.where(top > 0, 127 / top, 0)).round()
    xs = (top / 127).double()
    y = ((xq.double() * xs).view(m, k) @ qweight.double().t()) * scales.double()
    return y if bias is None else y + bias.double()
