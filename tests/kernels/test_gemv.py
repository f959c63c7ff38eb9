"""The GEMVs of kernels/cpu/gemv.c (the GEMM choice's ``gemv`` path): bf16 against float32 products of the same
values, float32 against float64 ones."""

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_info import cpu_info
from engine.models.gemm import PATHS, available_paths
from kernels.cpu import gemv, native
from tests.support.gemm_operands import bf16_operands

HAS_DOTS = "avx512_bf16" in cpu_info().flags


_operands = bf16_operands


def test_available_in_bf16_exactly_where_the_cpu_has_bf16_dot_products_and_in_float32_wherever_it_builds():
    assert gemv.available() == HAS_DOTS
    assert ("gemv" in available_paths("cpu", torch.bfloat16)) == HAS_DOTS
    built = native.load("gemv") is not None
    assert gemv.available(torch.float32) == built
    assert ("gemv" in available_paths("cpu", torch.float32)) == built


@pytest.mark.skipif(native.load("gemv") is None, reason="no C compiler")
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k", "bias"),
                         [(960, 576, False), (576, 1536, True), (49152, 576, False), (8, 8, True)])
def test_float32_matches_float64_products_to_the_sums_order(m, n, k, bias):
    g = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g) if bias else None
    y = gemv.gemv(x, w, b)
    assert y is not None and y.dtype == torch.float32 and y.shape == (m, n)
    expected = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(gemv.gemv(x[:1].clone(), w, b), y[:1])  # a row's result does not depend on the others


@pytest.mark.skipif(not HAS_DOTS, reason="the kernel needs AVX512-BF16; other CPUs never offer the path")
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k", "bias"),
                         [(960, 576, False), (576, 1536, True), (49152, 576, False), (16, 32, True)])
def test_matches_float32_products_within_one_bf16_rounding(m, n, k, bias):
    """Products of bf16 values are exact in float32 and the sums are float32 in another order; the result is rounded
    to bf16 once: within 2^-8 of the float32 result (plus 1e-3 near zero)."""
    x, w, b = _operands(m, n, k, bias, seed=m + n)
    y = gemv.gemv(x, w, b)
    assert y is not None and y.dtype == torch.bfloat16 and y.shape == (m, n)
    expected = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-3)


def test_declines_what_it_does_not_compute():
    x, w, b = _operands(1, 960, 576, True)
    assert gemv.gemv(x.float(), w, None) is None  # mixed dtypes
    assert gemv.gemv(x.half(), w.half(), None) is None  # float16
    assert gemv.gemv(torch.cat([x] * 5), w, b) is None  # more than four rows
    assert gemv.gemv(x[:, :560].contiguous(), w[:, :560].contiguous(), None) is None  # K not a multiple of 32
    assert gemv.gemv(x, w[:952].contiguous(), None) is None  # N not a multiple of 16
    assert gemv.gemv(x, w[:, ::2], None) is None  # not contiguous
    xf, wf = x.float(), w.float()
    assert gemv.gemv(xf[:, :572].contiguous(), wf[:, :572].contiguous(), None) is None  # K not a multiple of 8
    assert gemv.gemv(xf, wf[:956].contiguous(), None) is None  # N not a multiple of 8
    assert gemv.gemv(torch.cat([xf] * 5), wf, None) is None  # more than four rows


@pytest.mark.parametrize("m", [1, 8])
def test_the_gemm_path_falls_back_to_f_linear_past_the_kernel(m):
    x, w, b = _operands(m, 960, 576, True, seed=3)
    path = PATHS["gemv"]
    y = path.run(x, path.pack(w), b)
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float(), b.float()), rtol=2**-7, atol=2e-2)


def test_a_weight_the_kernel_cannot_take_is_refused_once_at_pack_and_runs_on_f_linear():
    x, w, b = _operands(1, 952, 576, True, seed=4)  # N = 952: a multiple of 8, not of 16
    path = PATHS["gemv"]
    operand = path.pack(w)
    assert operand[0] is None  # bf16 runs 16-row blocks (fp32 8-row ones: that weight in fp32 is taken)
    assert gemv.prepare(w.float()) is not None or native.load("gemv") is None
    torch.testing.assert_close(path.run(x, operand, b).float(), F.linear(x.float(), w.float(), b.float()),
                               rtol=2**-7, atol=2e-2)
