"""The ways this machine can compute a projection's ``y = x @ W.T + b``, and the kernel that runs one per M.

Paths, each in the model's dtype with fp32 accumulation:
  * ``torch``: ``F.linear`` (MKL for fp32 on x86, oneDNN for bf16; cuBLAS on CUDA, the only path there);
  * ``onednn``: oneDNN's inner product on a weight reordered once into its blocked layout
    (``torch.ops.mkldnn._reorder_linear_weight`` + ``_linear_pointwise``, what torch.compile's CPU backend emits
    for a frozen linear). On the AMD EPYC VM it ran 2-3x ``F.linear`` in fp32 at 8-256 tokens (DESIGN.md);
  * ``gemv`` (fp32 on any CPU, bf16 on CPUs with AVX512-BF16): ``kernels/cpu/gemv.c`` on the plain weight for one
    to four tokens (``max_tokens``: timed and chosen only there), streaming the weight in blocks of rows (16 on
    vdpbf16ps in bf16, 8 on FMAs in fp32). A step of one sequence ran 25% faster with it in bf16 (SmolLM2, Zen 4
    VM: 26.5 -> 20.0 ms a token, GEMMs 15.3 -> 11.1 ms); in fp32 on the Zen 1 VM it read the weights at 19-23 GB/s
    at M = 1 against oneDNN's 12-18;
  * ``packed`` (bf16 on CPUs with AVX512-BF16, fp32 on CPUs with AVX-512 or AVX2 + FMA):
    ``kernels/cpu/packed_gemm.c`` on the weight packed once into 32-column panels, 8 rows x 32 columns at a time
    (vdpbf16ps, or FMAs; 6 rows x 16 columns on AVX2), each next panel fetched while the one before is multiplied.
    On the Zen 5 VM, SmolLM2's layer projections at M = 64 with every layer's weights cycled (as a decode step
    reads them): 21.5 ms a step on ``onednn``, 16.0 here in bf16; 45.2 and 34.2 in fp32; on the AVX2 Zen 3 VM in
    fp32 115 against 86-91 ms (M = 8: 37 against 18-19);
  * ``widened`` (bf16 on CPUs with AVX-512F): the same bf16 panels, each pair widened to float32 in registers and
    multiplied on FMAs (the same products, exact in float32): for CPUs where vdpbf16ps is slower than FMAs or absent.
    On the 2-vCPU Xeon VM (Intel model 207 with AVX512-BF16, no AMX), 576 -> 1536 with the weight warm: M = 64 326
    GFLOP/s against ``packed``'s 211, M = 256 370 against 197;
and, for quantized weights (``engine.models.quant``), ``w8a8``, ``w8a8g`` (int8 activations in groups of 64, on
``kernels/cpu/int8_gemm.c``), ``w8a16`` and ``w4a16``, and ``dequantized`` (the
quantized values as a dense weight, on the packed kernel where it takes it, else oneDNN, for the bands where a step's
many tokens make the GEMM compute-bound) and ``dequantized_onednn`` (the same always on oneDNN, where both exist).
Which one is faster depends on the CPU, the shape and the number of tokens M, so ``engine.models.gemm_choice``
times them on the machine and binds a :class:`LinearKernel` to every projection.
"""

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from engine.models import quant
from kernels.cpu import gemv, packed_gemm


@dataclass(frozen=True, slots=True)
class GemmPath:
    name: str
    pack: Callable  # weight [out, in] (a tensor, or a quant.QuantizedWeight) -> the operand ``run`` multiplies by
    run: Callable  # (x [M, in], operand, bias [out] or None) -> [M, out] in x's dtype
    max_tokens: int | None = None  # the most rows it is meant for (timed and chosen up to there); None: any


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor:  # [out, in] -> oneDNN's blocked layout (opaque)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _onednn_run(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # [M, out]


def _dequantized_pack(weight) -> dict:  # a quant.Int8Weight/Int4Weight; its dense copy is made on first use
    return {"weight": weight, "by_dtype": {}}


def _dense_copy(operand: dict, dtype: torch.dtype, make: Callable) -> tuple[Callable, object]:
    """The quantized values in ``dtype`` as ``make`` lays them out ((run, operand)), made on first use per dtype."""
    dense = operand["by_dtype"].get(dtype)
    if dense is None:
        dense = operand["by_dtype"][dtype] = make(operand["weight"].dequantize().to(dtype))
    return dense


def _packed_else_onednn(weight: torch.Tensor) -> tuple[Callable, object]:
    packed = packed_gemm.pack(weight)  # the packed kernel's panels where it takes the weight
    return (_packed_run, (packed, None)) if packed is not None else (_onednn_run, _onednn_pack(weight))


def _dequantized_run(x: torch.Tensor, operand: dict, bias: torch.Tensor | None) -> torch.Tensor:
    run, dense = _dense_copy(operand, x.dtype, _packed_else_onednn)
    return run(x, dense, bias)


def dequantized_packed(operand: dict, dtype: torch.dtype) -> packed_gemm.PackedWeight | None:
    """The ``dequantized`` path's dense copy in ``dtype`` as the packed kernel's panels (made now if it was not yet),
    or None where that path runs oneDNN instead: what the layers' C replay (``native_forward``) runs for it."""
    run, dense = _dense_copy(operand, dtype, _packed_else_onednn)
    return dense[0] if run is _packed_run else None


def _dequantized_onednn_run(x: torch.Tensor, operand: dict, bias: torch.Tensor | None) -> torch.Tensor:
    run, dense = _dense_copy(operand, x.dtype, lambda weight: (_onednn_run, _onednn_pack(weight)))
    return run(x, dense, bias)


def _packed_pack(weight: torch.Tensor, widened: bool = False) -> tuple[packed_gemm.PackedWeight | None,
                                                                       torch.Tensor | None]:
    packed = packed_gemm.pack(weight, widened)
    return packed, (weight.detach() if packed is None else None)  # the plain weight only where it is needed


def _packed_run(x: torch.Tensor, operand: tuple, bias: torch.Tensor | None) -> torch.Tensor:
    packed, weight = operand
    y = None if packed is None else packed_gemm.packed_gemm(x.contiguous(), packed, bias)
    if y is not None:
        return y
    return F.linear(x, weight if weight is not None else packed_gemm.unpack(packed).to(x.dtype), bias)


def _gemv_pack(weight: torch.Tensor) -> tuple[gemv.GemvWeight | None, torch.Tensor]:
    weight = weight.detach().contiguous()
    return gemv.prepare(weight), weight


def _gemv_run(x: torch.Tensor, operand: tuple, bias: torch.Tensor | None) -> torch.Tensor:
    prepared, weight = operand
    y = None if prepared is None else gemv.gemv_prepared(x, prepared, bias)
    return y if y is not None else F.linear(x, weight, bias)


PATHS = {
    "torch": GemmPath("torch", lambda weight: weight, F.linear),
    "onednn": GemmPath("onednn", _onednn_pack, _onednn_run),
    "gemv": GemmPath("gemv", _gemv_pack, _gemv_run, gemv.MAX_ROWS),
    "packed": GemmPath("packed", _packed_pack, _packed_run),
    "widened": GemmPath("widened", lambda weight: _packed_pack(weight, widened=True), _packed_run),
    "w8a8": GemmPath("w8a8", quant.w8a8_pack, quant.w8a8_run),
    "w8a16": GemmPath("w8a16", quant.w8a16_pack, quant.w8a16_run),
    "w8a8g": GemmPath("w8a8g", quant.w8a8g_pack, quant.w8a8g_run),
    "w4a16": GemmPath("w4a16", quant.w4a16_pack, quant.w4a16_run),
    # the quantized weight's values in the activations' dtype, on the packed kernel (else oneDNN): the same numbers
    # as the weight-only kernels (int8 or int4 weights), at dense speed where many tokens make a step compute-bound;
    # a band that takes it holds a dense copy beside the quantized one
    "dequantized": GemmPath("dequantized", _dequantized_pack, _dequantized_run),
    # the same on oneDNN always: where its AMX-BF16 kernels beat the packed kernel's vdpbf16ps (Sapphire Rapids
    # class VM, 2026-12-05: 557 against 164 GFLOP/s at M = 64), which ``dequantized`` prefers where it applies
    "dequantized_onednn": GemmPath("dequantized_onednn", _dequantized_pack, _dequantized_onednn_run),
}


@cache
def available_paths(device_type: str, dtype: torch.dtype, fmt: str = "dense") -> tuple[str, ...]:
    """The paths that run ``dtype`` GEMMs on this device for weights of format ``fmt`` (``quant.weight_format``):
    for dense ones ``torch`` always, ``onednn`` on CPUs where this torch build has it for ``dtype``."""
    if fmt != "dense":
        dense_kernel = _onednn_works(dtype) or packed_gemm.available(dtype)
        dense = ("dequantized",) if device_type == "cpu" and dense_kernel else ()
        dense += ("dequantized_onednn",) if dense and packed_gemm.available(dtype) and _onednn_works(dtype) else ()
        return quant.quantized_paths(device_type, dtype, fmt) + dense
    if device_type != "cpu":
        return ("torch",)
    paths = ("torch", "onednn") if _onednn_works(dtype) else ("torch",)
    paths += ("gemv",) if gemv.available(dtype) else ()
    paths += ("packed",) if packed_gemm.available(dtype) else ()
    return paths + ("widened",) if dtype == torch.bfloat16 and packed_gemm.available_widened() else paths


def _onednn_works(dtype: torch.dtype) -> bool:
    # Tried, not inferred from flags: the op may be missing from a build, or refuse a dtype on a CPU (fp16
    # without AVX-512 FP16, say).
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    weight = torch.ones(8, 8, dtype=dtype)
    try:
        y = _onednn_run(torch.ones(2, 8, dtype=dtype), _onednn_pack(weight), None)
    except RuntimeError:
        return False
    return bool(torch.all(y == 8))


class LinearKernel:
    """``y = x @ W.T + b`` through the path chosen for the band of token counts x falls in.

    ``bands``: ``(max_tokens, path name)`` by increasing ``max_tokens``; more tokens than the last band take its
    path. Each path's operand is made once (given in ``operands``, or packed from ``weight`` here); a kernel
    whose bands never use ``torch`` keeps no reference to the plain weight.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bands: Sequence[tuple[int, str]],
                 operands: Mapping[str, torch.Tensor] | None = None):
        if not bands or any(path not in PATHS for _, path in bands):
            raise ValueError(f"bands must be (max_tokens, path) pairs with paths in {sorted(PATHS)}, got {bands!r}")
        self.bands = tuple((int(limit), path) for limit, path in bands)
        self.paths = frozenset(path for _, path in self.bands)
        self.bias = bias  # [out] or None
        operands = dict(operands or {})
        for path in self.paths - operands.keys():
            operands[path] = PATHS[path].pack(weight)
        self._limits = [limit for limit, _ in self.bands]
        self._calls = [(PATHS[path].run, operands[path]) for _, path in self.bands]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        band = min(bisect_left(self._limits, x.shape[0]), len(self._calls) - 1)
        run, operand = self._calls[band]
        return run(x, operand, self.bias)

    def band(self, num_tokens: int) -> tuple[str, object]:
        """(path name, its operand) that a call of ``num_tokens`` rows runs."""
        band = min(bisect_left(self._limits, num_tokens), len(self._calls) - 1)
        return self.bands[band][1], self._calls[band][1]
