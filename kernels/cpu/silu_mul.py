"""The C SiLU-and-multiply of ``silu_mul.c`` (``silu(gate) * up`` from the gate|up projection's output), for
bfloat16 and float32 on CPU.

It returns None where the C build is missing, the CPU has neither AVX-512 nor AVX2 + FMA, or the input is not a
contiguous bfloat16 or float32 CPU tensor [T, 2I], and the caller runs torch's ops. The results are torch's in
bfloat16 but where the exp's last float32 bits tip a rounding (one bf16 unit of the silu, in under 0.1% of the values),
and within a few units in the last place in float32.
"""

import ctypes

import torch

from kernels.cpu import native

_P, _I = ctypes.c_void_p, ctypes.c_int64
_VARIANTS = {torch.bfloat16: ("ACT_BF16",), torch.float32: ()}


def _library(dtype: torch.dtype):
    library = native.load("silu_mul", _VARIANTS[dtype])
    if library is not None and not getattr(library, "_typed", False):
        library.silu_mul_available.restype = ctypes.c_int
        library.silu_mul.restype = None
        library.silu_mul.argtypes = [_P, _P, _I, _I, _I]
        library._typed = True
    return library


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """``silu(gate_up[:, :I]) * gate_up[:, I:]`` ([T, I]) for ``gate_up`` [T, 2I]; None where it does not apply."""
    if not (gate_up.dtype in _VARIANTS and gate_up.device.type == "cpu" and gate_up.dim() == 2
            and gate_up.shape[1] % 2 == 0 and gate_up.is_contiguous()):
        return None
    library = _library(gate_up.dtype)
    if library is None or not library.silu_mul_available():
        return None
    rows, size = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, size, dtype=gate_up.dtype)
    if rows:
        library.silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, size, torch.get_num_threads())
    return out
