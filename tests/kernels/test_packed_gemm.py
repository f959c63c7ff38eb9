"""The GEMMs of kernels/cpu/packed_gemm.c (the GEMM choice's ``packed`` path): bf16 against float32 products of the
same values, float32 against float64 ones; every row count around the 8-row (6 on AVX2) microkernel, SmolLM2's
shapes, a bias, and what they decline."""

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_info import cpu_info
from engine.models.gemm import PATHS, available_paths
from kernels.cpu import packed_gemm
from tests.support.gemm_operands import bf16_operands

HAS_DOTS = {"avx512_bf16", "avx512bw"} <= cpu_info().flags
HAS_F32 = "avx512f" in cpu_info().flags or {"avx2", "fma"} <= cpu_info().flags
HAS_WIDE = "avx512f" in cpu_info().flags  # the bf16 kernel on FMAs (packed_gemm_widened)
needs_dots = pytest.mark.skipif(not HAS_DOTS, reason="the kernel needs AVX512-BF16; other CPUs never offer the path")
needs_wide = pytest.mark.skipif(not HAS_WIDE, reason="the widened bf16 kernel needs AVX-512F, as its path does")
needs_f32 = pytest.mark.skipif(not HAS_F32, reason="the fp32 kernel needs AVX-512 or AVX2 + FMA, as its path does")
# every remainder of the 8-row (AVX2: 6-row) kernel, and from 9 rows on (bf16; float32 on AVX-512 from 17) blocks of
# up to 12 rows
ROW_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 25, 37, 64, 130, 145]


_operands = bf16_operands


def test_available_exactly_where_the_cpu_has_the_instructions():
    assert packed_gemm.available() == HAS_DOTS
    assert ("packed" in available_paths("cpu", torch.bfloat16)) == HAS_DOTS
    assert packed_gemm.available(torch.float32) == HAS_F32
    assert ("packed" in available_paths("cpu", torch.float32)) == HAS_F32
    assert not packed_gemm.available(torch.float16)
    assert packed_gemm.available_widened() == HAS_WIDE
    assert ("widened" in available_paths("cpu", torch.bfloat16)) == HAS_WIDE


@needs_dots
def test_the_panels_hold_the_weight():
    _, w, _ = _operands(1, 96, 10, False)
    packed = packed_gemm.pack(w)
    panels = packed.data.view(3, 5, 32, 2)  # [N / 32][K / 2][32][2]
    assert torch.equal(panels[1, 2, 7], w[32 + 7, 4:6])
    assert torch.equal(packed_gemm.unpack(packed), w)
    if HAS_F32:
        packed = packed_gemm.pack(w.float())
        assert torch.equal(packed.data.view(3, 10, 32)[1, 4, 7], w[32 + 7, 4].float())  # [N / 32][K][32]
        assert torch.equal(packed_gemm.unpack(packed), w.float())


@needs_dots
@pytest.mark.parametrize("m", ROW_COUNTS)
@pytest.mark.parametrize(("n", "k", "bias"),
                         [(960, 576, False), (576, 1536, True), (3072, 576, False), (32, 2, True), (64, 34, False)])
def test_matches_float32_products_within_one_bf16_rounding(m, n, k, bias):
    """Products of bf16 values are exact in float32 and the sums are float32 in another order; the result is rounded
    to bf16 once: within 2^-8 of the float32 result (plus 1e-3 near zero), each row on its own."""
    x, w, b = _operands(m, n, k, bias, seed=m + n + k)
    y = packed_gemm.packed_gemm(x, packed_gemm.pack(w), b)
    assert y is not None and y.dtype == torch.bfloat16 and y.shape == (m, n)
    expected = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-3)
    assert torch.equal(packed_gemm.packed_gemm(x[-1:].clone(), packed_gemm.pack(w), b), y[-1:])


@needs_wide
@pytest.mark.parametrize("m", ROW_COUNTS)
@pytest.mark.parametrize(("n", "k", "bias"),
                         [(960, 576, False), (576, 1536, True), (3072, 576, False), (32, 2, True), (64, 34, False)])
def test_widened_matches_float32_products_within_one_bf16_rounding(m, n, k, bias):
    """The bf16 panels widened to float32 on FMAs: the same exact products, float32 sums, one rounding to bf16."""
    x, w, b = _operands(m, n, k, bias, seed=m + n + k)
    packed = packed_gemm.pack(w, widened=True)
    y = packed_gemm.packed_gemm(x, packed, b)
    assert y is not None and y.dtype == torch.bfloat16 and y.shape == (m, n)
    expected = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-3)
    assert torch.equal(packed_gemm.packed_gemm(x[-1:].clone(), packed, b), y[-1:])
    if HAS_DOTS:  # the same panels as the vdpbf16ps kernel's
        assert torch.equal(packed.data, packed_gemm.pack(w).data)


@needs_wide
def test_widened_rounds_to_nearest_even_as_torch_does():
    """With two inputs a sum is rounded once in float32 whatever the order, so each bf16 result is torch's rounding
    of the float32 one: ties to even, values past bf16's range to infinity, NaN kept."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(145, 2, generator=g) * torch.logspace(-30, 30, 145).unsqueeze(1)).to(torch.bfloat16)
    w = torch.randn(64, 2, generator=g).to(torch.bfloat16)
    x[0, 0], x[1, 1], x[2, 0] = float("nan"), float("inf"), 3e38
    y = packed_gemm.packed_gemm(x, packed_gemm.pack(w, widened=True), None)
    expected = F.linear(x.float(), w.float()).to(torch.bfloat16)
    assert torch.equal(y.isnan(), expected.isnan()) and y[0].isnan().all()
    assert torch.equal(y[~y.isnan()], expected[~expected.isnan()])


@needs_f32
@pytest.mark.parametrize("m", ROW_COUNTS)
@pytest.mark.parametrize(("n", "k", "bias"), [(960, 576, True), (576, 1536, False), (32, 1, True), (64, 35, False)])
def test_float32_matches_float64_products_to_the_sums_order(m, n, k, bias):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g) if bias else None
    y = packed_gemm.packed_gemm(x, packed_gemm.pack(w), b)
    assert y is not None and y.dtype == torch.float32 and y.shape == (m, n)
    expected = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(packed_gemm.packed_gemm(x[-1:].clone(), packed_gemm.pack(w), b), y[-1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "widened"])
@pytest.mark.parametrize("m", [9, 12, 17, 24, 40, 64, 145])
def test_blocks_of_interleaved_rows_give_the_8_row_kernels_bits(m, dtype):
    """From 9 rows on in bf16 (17 in AVX-512 float32) x's rows are interleaved in blocks of up to 12; each sum still
    runs over the inputs in order from zero, so the result is bit for bit that of 8 rows at a time (x's rows as they
    come; the widened kernel always blocks its rows, in blocks that depend on M)."""
    widened = dtype == "widened"
    if not {torch.bfloat16: HAS_DOTS, torch.float32: HAS_F32, "widened": HAS_WIDE}[dtype]:
        pytest.skip(f"no {dtype} kernel on this CPU")
    dtype = torch.bfloat16 if widened else dtype
    g = torch.Generator().manual_seed(m)
    x, w = torch.randn(m, 576, generator=g).to(dtype), (torch.randn(960, 576, generator=g) / 24).to(dtype)
    b = torch.randn(960, generator=g).to(dtype)
    packed = packed_gemm.pack(w, widened)
    pieces = torch.cat([packed_gemm.packed_gemm(x[i:i + 8].clone(), packed, b) for i in range(0, m, 8)])
    assert torch.equal(packed_gemm.packed_gemm(x, packed, b), pieces)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "widened"])
@pytest.mark.parametrize(("m", "k"), [(2047, 576), (1100, 1536)])
def test_a_large_x_walked_in_chunks_gives_the_bits_of_small_calls(m, k, dtype):
    """Past 2 MiB of x (a prefill chunk of 2048 tokens) each thread walks its panels once per 512 KiB of x's rows;
    every sum is still the same run over the inputs, so the result is bit for bit that of 8 rows at a time."""
    widened = dtype == "widened"
    if not {torch.float32: HAS_F32, torch.bfloat16: HAS_DOTS, "widened": HAS_WIDE}[dtype]:
        pytest.skip(f"no {dtype} kernel on this CPU")
    dtype = torch.bfloat16 if widened else dtype
    g = torch.Generator().manual_seed(m + k)
    x, w = torch.randn(m, k, generator=g).to(dtype), (torch.randn(96, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(96, generator=g).to(dtype)
    assert x.numel() * (4 if widened else x.element_size()) > 2 * 2**20  # the chunked walk
    packed = packed_gemm.pack(w, widened)
    pieces = torch.cat([packed_gemm.packed_gemm(x[i:i + 8].clone(), packed, b) for i in range(0, m, 8)])
    assert torch.equal(packed_gemm.packed_gemm(x, packed, b), pieces)


@needs_dots
def test_the_vocabulary_projection_of_smollm2():
    x, w, _ = _operands(5, 49152, 576, False, seed=7)
    y = packed_gemm.packed_gemm(x, packed_gemm.pack(w), None)
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2**-8, atol=1e-3)


def test_declines_what_it_does_not_compute():
    x, w, b = _operands(3, 960, 576, True)
    assert packed_gemm.pack(w.half()) is None  # float16
    assert packed_gemm.pack(w.float()[:944]) is None  # N not a multiple of 32, in float32 too
    assert packed_gemm.pack(w[:944]) is None  # N not a multiple of 32
    assert packed_gemm.pack(w[:, :575]) is None  # K odd
    assert packed_gemm.pack(w[0]) is None  # not a matrix
    assert packed_gemm.pack(w.float(), widened=True) is None  # the widened kernel takes bf16 weights only
    assert packed_gemm.pack(w[:, :575], widened=True) is None  # K odd
    if not HAS_DOTS:
        assert packed_gemm.pack(w) is None
        return
    packed = packed_gemm.pack(w)
    assert packed_gemm.packed_gemm(x.float(), packed, None) is None  # x of another dtype
    if HAS_F32:
        assert packed_gemm.packed_gemm(x, packed_gemm.pack(w.float()), None) is None  # bf16 x, float32 weight
    assert packed_gemm.packed_gemm(x[:, :574].contiguous(), packed, None) is None  # K of another weight
    assert packed_gemm.packed_gemm(x[:, ::2], packed, None) is None  # not contiguous
    assert packed_gemm.packed_gemm(x[:0], packed, None) is None  # no rows
    assert packed_gemm.packed_gemm(x, packed, b.float()) is None  # bias of another dtype
    assert packed_gemm.packed_gemm(x, packed, b[:32].contiguous()) is None  # bias of another length


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (944, 576)])
def test_the_gemm_path_multiplies_what_the_kernel_declines(n, k, dtype):
    """The path on a weight the kernel cannot pack (N not a multiple of 32), or on x not contiguous, is F.linear."""
    x, w, b = (t.to(dtype) for t in _operands(6, n, k, True, seed=3))
    path = PATHS["packed"]
    operand = path.pack(w)
    expected = F.linear(x.float(), w.float(), b.float())
    for rows in (x, torch.stack([x, x], dim=2)[:, :, 0]):  # the same values, strided
        torch.testing.assert_close(path.run(rows, operand, b).float(), expected, rtol=2**-7, atol=2e-2)
