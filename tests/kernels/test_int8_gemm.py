"""The int8 GEMM of kernels/cpu/int8_gemm.c (the GEMM choice's ``w8a8g`` path): against the same quantization done
in torch in float64 (``int8_gemm.reference``), every row count around the 6-row (AVX2: 4-row) microkernel, AMX's
16-row tiles and the 192-row chunks, SmolLM2's shapes, bf16 and float32 activations, a bias, outlier channels, zero
rows, and what it declines."""

import pytest
import torch

from engine.cpu_info import cpu_info
from engine.models.gemm import PATHS
from engine.models.quant import Int8Weight, quantize_int8, quantized_paths
from kernels.cpu import int8_gemm

HAS_VNNI = {"avx512_vnni", "avx512bw"} <= cpu_info().flags
HAS_KERNEL = HAS_VNNI or {"avx2", "fma"} <= cpu_info().flags  # vpdpbusd, else vpmaddubsw
needs_kernel = pytest.mark.skipif(not HAS_KERNEL, reason="the kernel needs AVX512-VNNI or AVX2 + FMA, as its path does")
# remainders of the 6-row kernel (4 on AVX2), of AMX's 16-row tiles (from 16 rows on) and of the 192-row chunk
ROW_COUNTS = [1, 2, 3, 5, 6, 7, 12, 13, 15, 16, 17, 33, 64, 191, 193, 400]


def operands(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    x[:, 5] *= 40  # an outlier channel: it sets its own group's scale only
    weight = quantize_int8(torch.randn(n, k, generator=gen) * 0.05)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x.to(dtype), weight, b


def test_available_exactly_where_the_cpu_has_the_instructions():
    assert int8_gemm.available() == HAS_KERNEL
    assert ("w8a8g" in quantized_paths("cpu", torch.bfloat16, "int8")) == HAS_KERNEL


@needs_kernel
def test_the_panels_hold_the_weight_plus_128():
    weight = quantize_int8(torch.randn(96, 128))
    packed = int8_gemm.pack(weight.qweight, weight.scales)
    panels = packed.data.view(3, 32, 32, 4)  # [N / 32][K / 4][32][4]
    assert torch.equal(panels[1, 2, 7].int() - 128, weight.qweight[32 + 7, 8:12].int())


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", ROW_COUNTS)
@pytest.mark.parametrize(("n", "k", "bias"), [(960, 576, False), (576, 1536, True), (32, 64, True)])
def test_matches_the_same_quantization_in_float64(dtype, m, n, k, bias):
    """The group sums are exact in int32; what differs from float64 is the float32 sum over groups and, in bf16,
    the one rounding of y: within 2^-8 of the result (bf16) or 1e-5 of its scale (float32). An input within a few
    ulps of half a step may round the other way in the kernel's float32 than in torch's: its row may then differ by
    one step of that input times a weight (a few in 10^5 inputs), never more than two such steps."""
    x, weight, b = operands(m, n, k, dtype, bias, seed=m + n + k)
    y = int8_gemm.int8_gemm(x, int8_gemm.pack(weight.qweight, weight.scales), b)
    assert y is not None and y.dtype == dtype and y.shape == (m, n)
    expected = int8_gemm.reference(x, weight.qweight, weight.scales, b)
    scale = float(expected.abs().max())
    rtol, atol = (2**-8, 1e-3 * scale) if dtype == torch.bfloat16 else (1e-5, 1e-5 * scale)
    within = ((y.double() - expected).abs() <= atol + rtol * expected.abs()).all(dim=1)  # [m]
    step = x.float().abs().amax(dim=1).double() / 127 * float(weight.dequantize().abs().max())  # [m]
    assert int((~within).sum()) <= max(1, m // 50)
    assert bool(((y.double() - expected).abs() <= atol + rtol * expected.abs() + 2 * step[:, None]).all())
    # each row on its own: the chunks and row blocks change nothing
    assert torch.equal(int8_gemm.int8_gemm(x[-1:].clone(), int8_gemm.pack(weight.qweight, weight.scales), b), y[-1:])


@needs_kernel
@pytest.mark.parametrize("m", [1, 6, 7, 64])
def test_bf16_results_are_the_float32_results_rounded_to_nearest_even(m):
    """bf16 x holds the same values as its float32 copy, so both quantize alike and sum alike: the bf16 call's y
    is the float32 call's y rounded once, as torch rounds (vcvtne2ps2bf16 where the CPU has AVX512-BF16, integer
    steps where it has VNNI without BF16)."""
    x, weight, b = operands(m, 576, 1536, torch.bfloat16, True, seed=m)
    packed = int8_gemm.pack(weight.qweight, weight.scales)
    y16 = int8_gemm.int8_gemm(x, packed, b)
    y32 = int8_gemm.int8_gemm(x.float(), packed, b.float())
    assert y16 is not None and y32 is not None and y16.dtype == torch.bfloat16
    assert torch.equal(y16, y32.to(torch.bfloat16))


def test_amx_tiles_only_where_the_cpu_has_them():
    assert int8_gemm.amx() <= ({"amx_tile", "amx_int8"} <= cpu_info().flags and HAS_VNNI)


@needs_kernel
@pytest.mark.parametrize("m", [16, 40, 200])
def test_row_counts_that_take_tiles_give_the_vector_kernels_numbers(m):
    """From 16 rows on a call runs on AMX tiles where the CPU has them; fewer rows take vpdpbusd. Both sum each
    group exactly in int32 and fold the groups in the same float32 order, so 8 rows at a time give the same bits."""
    x, weight, b = operands(m, 576, 1536, torch.bfloat16, True, seed=m)
    packed = int8_gemm.pack(weight.qweight, weight.scales)
    whole = int8_gemm.int8_gemm(x, packed, b)
    pieces = torch.cat([int8_gemm.int8_gemm(x[i:i + 8].clone(), packed, b) for i in range(0, m, 8)])
    assert torch.equal(whole, pieces)


@needs_kernel
def test_close_to_the_float_product_and_zero_rows_stay_zero():
    """Quantization error, not a wrong sum: within 2% of the float product's scale with an outlier channel, where one
    scale a token would spread the outlier over the whole row; a row of zeros gives exactly the bias."""
    x, weight, b = operands(8, 64, 576, torch.float32, True)
    x[3] = 0
    y = int8_gemm.int8_gemm(x, int8_gemm.pack(weight.qweight, weight.scales), b)
    exact = x @ weight.dequantize().t() + b
    assert float((y - exact).abs().max()) < 0.02 * float(exact.abs().max())
    assert torch.equal(y[3], b)


@needs_kernel
def test_declines_what_it_cannot_take():
    weight = quantize_int8(torch.randn(48, 64))
    assert int8_gemm.pack(weight.qweight, weight.scales) is None  # N not a multiple of 32
    weight = quantize_int8(torch.randn(32, 96))
    assert int8_gemm.pack(weight.qweight, weight.scales) is None  # K not a multiple of 64
    weight = quantize_int8(torch.randn(32, 64))
    packed = int8_gemm.pack(weight.qweight, weight.scales)
    assert int8_gemm.int8_gemm(torch.randn(2, 64).half(), packed, None) is None
    assert int8_gemm.int8_gemm(torch.randn(2, 128), packed, None) is None
    assert int8_gemm.int8_gemm(torch.randn(64, 2).t(), packed, None) is None  # not contiguous


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_the_path_falls_back_where_the_kernel_declines(dtype):
    """``w8a8g`` on a shape the kernel does not take (48 outputs), or an x it does not take (float16), runs the
    weight-only kernel on the same int8 values (bf16 activations): the path never fails a projection."""
    path = PATHS["w8a8g"]
    for weight in (quantize_int8(torch.randn(48, 64)), quantize_int8(torch.randn(64, 128))):
        x = torch.randn(3, weight.shape[1]).to(dtype)
        y = path.run(x, path.pack(weight), None)
        expected = x.float() @ Int8Weight(weight.qweight, weight.scales).dequantize().t()
        assert y.dtype == dtype and y.shape == (3, weight.shape[0])
        torch.testing.assert_close(y.float(), expected, rtol=0.05, atol=0.05 * float(expected.abs().max()))
