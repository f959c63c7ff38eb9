"""Quantized projection weights and the GEMM paths that multiply by them (``quantization="int8"``, GGUF files).

Weight formats:
  * :class:`Int8Weight`: symmetric int8 per output channel, fp32 scales (``w ~= q * scale[row]``): made at load from
    a float checkpoint (:func:`quantize_int8`) or from a GGUF ``Q8_0`` tensor (per-32 block scales requantized per
    channel, ``engine.models.gguf``);
  * :class:`Int4Weight`: 4-bit values in groups of 32 along the input axis with a scale and an offset per group,
    torch's CPU int4 layout (``w = (q - 8) * scale + zero``): GGUF ``Q4_0`` (zero 0) and ``Q4_1`` (``zero = m + 8d``)
    map onto it exactly.

Paths (each takes activations in the model's dtype and returns the model's dtype; registered in
``engine.models.gemm.PATHS``):
  * ``w8a16`` (what ``quantization="int8"`` runs): ``torch.ops.aten._weight_int8pack_mm``, activations in bf16, the
    int8 weight widened in the kernel. An fp32 model's activations are rounded to bf16 for it (and the result
    widened back): its fp32 kernel ran at 7 GFLOP/s on the Sapphire Rapids VM (scalar code), bf16 at 50-165;
  * ``w8a8``: each token's activations quantized to 8 bits with its own scale (amax / 127, unsigned with zero point
    128: :func:`quantize_rows`) at every call, u8 x s8 -> int32 sums in oneDNN's inner product on a weight
    prepacked once (``torch.ops.onednn.qlinear_prepack`` + ``qlinear_pointwise``: VNNI / AMX-INT8), times the
    weight's scales in oneDNN, then each row's own scale. Offered only on CPUs whose int8 dot products sum exactly
    (``cpu_info.INT8_DOT_FLAGS``), and only to the projections in :data:`W8A8_PROJECTIONS`: rounding every input of
    every projection to 8 bits per token fails SmolLM2-135M's int8 quality gates (teacher-forced greedy agreement
    89.6%, perplexity +2.1% in bf16 on the Sapphire Rapids VM; 89.8%, +4.7% with q|k|v, o and gate|up on a Zen 4
    EPYC, the down projection's input having outliers), where the gate|up projection alone passes them (93.0%,
    -0.8% in bf16; 91.7%, +1.9% in fp32; weight-only w8a16 elsewhere). Its GEMM at M = 64 on that EPYC: 690
    GFLOP/s against oneDNN bf16's 386, 526 with the activations' quantization and rescaling;
  * ``w8a8g``: ``kernels/cpu/int8_gemm.c`` on CPUs with AVX512-VNNI (or AVX2 + FMA): each token's activations
    quantized at every call in groups of 64 inputs, each group with its own scale, int8 x int8 -> int32 dot products
    per group (vpdpbusd; vpmaddubsw on AVX2) summed over groups in float32 with the groups' scales. Groups keep a
    few outlier channels from flattening the rest of a token, so it may take every projection: SmolLM2-135M in
    bf16 with it on all of them, simulated, gave agreement 94.3% and perplexity +2.1% (groups of 32: 93.2%, +1.1%;
    one scale a token: 89.3%, +4.5%);
  * ``w4a16``: ``torch.ops.aten._weight_int4pack_mm_for_cpu`` on the packed 4-bit weight, the only int4 path.
"""

from dataclasses import dataclass
from functools import cache

import torch

from engine.cpu_info import cpu_info
from kernels.cpu import int8_gemm

INT4_GROUP = 32  # GGUF's Q4_0 / Q4_1 block: one scale (and offset) per 32 inputs
INT4_ROWS = 16  # torch's CPU int4 packing takes weights whose rows (outputs) are a multiple of this


@dataclass(frozen=True, slots=True)
class Int8Weight:
    qweight: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.qweight.shape)

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        return self.qweight.float() * self.scales[:, None]


@dataclass(frozen=True, slots=True)
class Int4Weight:
    qvalues: torch.Tensor  # [out, in] uint8 in 0..15 (unpacked: packing is the path's job)
    scales: torch.Tensor  # [out, in / 32] float32
    zeros: torch.Tensor  # [out, in / 32] float32: w = (q - 8) * scale + zero

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.qvalues.shape)

    def dequantize(self) -> torch.Tensor:  # [out, in] float32
        out, n = self.qvalues.shape
        groups = (self.qvalues.float() - 8).view(out, n // INT4_GROUP, INT4_GROUP)
        return (groups * self.scales[..., None] + self.zeros[..., None]).view(out, n)


QuantizedWeight = Int8Weight | Int4Weight


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric per-output-channel int8 of a float weight [out, in]: scale = the row's amax / 127."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # [out]
    qweight = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(qweight, scales)


def weight_format(weight) -> str:
    """``dense``, ``int8`` or ``int4``: which family of GEMM paths can multiply by ``weight``."""
    if isinstance(weight, Int8Weight):
        return "int8"
    if isinstance(weight, Int4Weight):
        return "int4"
    return "dense"


# ---- per-token activation quantization (W8A8)
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x [M, in] to 8 bits with its own scale: ([M, in] uint8 holding round(x / scale) + 128, [M, 1]
    float32). Unsigned with zero point 128, not int8: oneDNN's int8 GEMM takes unsigned activations natively (VNNI's
    vpdpbusd multiplies u8 by s8); signed ones fell to a reference kernel on AMD EPYC (0.2 GFLOP/s against 550)."""
    scales = x.abs().amax(dim=-1, keepdim=True).float().clamp_min_(1e-12).div_(127)  # [M, 1]
    return (x / scales).round_().add_(128).to(torch.uint8), scales  # |x / scale| <= 127 by construction


# ---- the paths: pack (weight -> operand) and run (x, operand, bias)
@dataclass(frozen=True, slots=True)
class _W8A8Operand:
    packed: torch.Tensor  # oneDNN's prepacked int8 weight (opaque)
    scales: torch.Tensor  # [out] float32
    zero_points: torch.Tensor  # [out] int64, all 0 (symmetric)


def w8a8_pack(weight: Int8Weight) -> _W8A8Operand:
    return _W8A8Operand(torch.ops.onednn.qlinear_prepack(weight.qweight, None), weight.scales,
                        torch.zeros(weight.shape[0], dtype=torch.int64))


def w8a8_run(x: torch.Tensor, operand: _W8A8Operand, bias: torch.Tensor | None) -> torch.Tensor:
    xq, x_scales = quantize_rows(x)  # [M, in] uint8, [M, 1]
    # oneDNN takes one activation scale per call: 1 there, each row's scale applied to the fp32 result. The bias
    # is added after that, so it is not scaled by it.
    y = torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, operand.packed, operand.scales, operand.zero_points, None,
                                           1.0, 0, torch.float32, "none", [], "")  # [M, out] float32
    y.mul_(x_scales)
    if bias is not None:
        y.add_(bias)
    return y.to(x.dtype)


@dataclass(frozen=True, slots=True)
class _W8A16Operand:
    qweight: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out] in the activations' dtype (the kernel requires it)


def w8a16_pack(weight: Int8Weight) -> dict:
    # Scales per activation dtype, made on first use: the model's dtype is only known when x arrives.
    return {"qweight": weight.qweight, "scales": weight.scales, "by_dtype": {}}


def w8a16_run(x: torch.Tensor, operand: dict, bias: torch.Tensor | None) -> torch.Tensor:
    dtype = torch.bfloat16 if x.dtype == torch.float32 else x.dtype  # see the module docstring
    scales = operand["by_dtype"].get(dtype)
    if scales is None:
        scales = operand["by_dtype"][dtype] = operand["scales"].to(dtype)
    y = torch.ops.aten._weight_int8pack_mm(x.to(dtype), operand["qweight"], scales).to(x.dtype)  # [M, out]
    return y if bias is None else y.add_(bias)


def w8a8g_pack(weight: Int8Weight) -> dict:
    packed = int8_gemm.pack(weight.qweight, weight.scales)
    return {"packed": packed, "fallback": w8a16_pack(weight) if packed is None else None}  # a shape it declines


def w8a8g_run(x: torch.Tensor, operand: dict, bias: torch.Tensor | None) -> torch.Tensor:
    packed = operand["packed"]
    y = None if packed is None else int8_gemm.int8_gemm(x.contiguous(), packed, bias)
    if y is not None:
        return y
    if operand["fallback"] is None:  # an x the kernel declines (float16): the weight-only kernel on the same values
        operand["fallback"] = w8a16_pack(Int8Weight(_unpack_int8(packed), packed.scales))
    return w8a16_run(x, operand["fallback"], bias)


def _unpack_int8(packed: int8_gemm.Int8Packed) -> torch.Tensor:
    """The int8 weight [N, K] back from ``int8_gemm``'s panels."""
    n, k = packed.n, packed.k
    panels = packed.data.view(n // int8_gemm.PANEL, k // 4, int8_gemm.PANEL, 4).permute(0, 2, 1, 3).reshape(n, k)
    return (panels.to(torch.int16) - 128).to(torch.int8)


def w4a16_pack(weight: Int4Weight) -> dict:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.qvalues.to(torch.int32), 1)
    scales_zeros = torch.stack([weight.scales, weight.zeros], dim=-1).transpose(0, 1).contiguous()  # [in/32, out, 2]
    return {"packed": packed, "scales_zeros": scales_zeros, "by_dtype": {}}


def w4a16_run(x: torch.Tensor, operand: dict, bias: torch.Tensor | None) -> torch.Tensor:
    scales_zeros = operand["by_dtype"].get(x.dtype)
    if scales_zeros is None:
        scales_zeros = operand["by_dtype"][x.dtype] = operand["scales_zeros"].to(x.dtype)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, operand["packed"], INT4_GROUP, scales_zeros)  # [M, out]
    return y if bias is None else y.add_(bias)


@cache
def quantized_paths(device_type: str, dtype: torch.dtype, fmt: str) -> tuple[str, ...]:
    """The paths that multiply ``dtype`` activations by a weight of format ``fmt`` on this device, each tried once
    (an op may be missing from a build or refuse a CPU). ``w8a8`` is among them where int8 dot products sum exactly;
    :func:`allows_w8a8` says which projections may take it."""
    if device_type != "cpu":
        raise ValueError(f"quantized weights run on CPU only in this engine (device {device_type!r})")
    int8 = ("w8a16", "w8a8") if cpu_info().has_int8_dot else ("w8a16",)
    int8 += ("w8a8g",) if int8_gemm.available() else ()
    candidates = {"int8": int8, "int4": ("w4a16",)}[fmt]
    paths = tuple(name for name in candidates if _works(name, dtype))
    if not paths:
        raise ValueError(f"this torch build has no {fmt} GEMM for {dtype} on this CPU")
    return paths


# The projections (``GemmGroup.name``) whose inputs w8a8 may round to 8 bits a token: see the module docstring.
W8A8_PROJECTIONS = frozenset({"gate_proj+up_proj"})


def allows_w8a8(projection: str) -> bool:
    return projection in W8A8_PROJECTIONS


def _works(name: str, dtype: torch.dtype) -> bool:
    pack, run = {"w8a8": (w8a8_pack, w8a8_run), "w8a16": (w8a16_pack, w8a16_run), "w8a8g": (w8a8g_pack, w8a8g_run),
                 "w4a16": (w4a16_pack, w4a16_run)}[name]
    rows = 2 * INT4_ROWS  # w8a8g's kernel takes outputs in panels of 32 (else it falls back to w8a16)
    weight = torch.ones(rows, 64)
    quantized = quantize_int8(weight) if name != "w4a16" else Int4Weight(
        torch.full((rows, 64), 9, dtype=torch.uint8), torch.ones(rows, 2), torch.zeros(rows, 2))
    try:
        y = run(torch.ones(2, 64, dtype=dtype), pack(quantized), None)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return y.dtype == dtype and bool(torch.all(y.float() == 64))
