"""The bf16 GEMM of kernels/cpu/packed_gemm.c (the GEMM choice's ``packed`` path) against float32 products of the
same values: every row count around its 8-row microkernel, SmolLM2's shapes, a bias, and what it declines."""

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_info import cpu_info
from engine.models.gemm import PATHS, available_paths
from kernels.cpu import packed_gemm
from tests.support.gemm_operands import bf16_operands

HAS_DOTS = {"avx512_bf16", "avx512bw"} <= cpu_info().flags
needs_dots = pytest.mark.skipif(not HAS_DOTS, reason="the kernel needs AVX512-BF16; other CPUs never offer the path")


_operands = bf16_operands


def test_available_exactly_where_the_cpu_has_bf16_dot_products():
    assert packed_gemm.available() == HAS_DOTS
    assert ("packed" in available_paths("cpu", torch.bfloat16)) == HAS_DOTS
    assert "packed" not in available_paths("cpu", torch.float32)


@needs_dots
def test_the_panels_hold_the_weight():
    _, w, _ = _operands(1, 96, 10, False)
    packed = packed_gemm.pack(w)
    panels = packed.data.view(3, 5, 32, 2)  # [N / 32][K / 2][32][2]
    assert torch.equal(panels[1, 2, 7], w[32 + 7, 4:6])
    assert torch.equal(packed_gemm.unpack(packed), w)


@needs_dots
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17, 64, 130])
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


@needs_dots
def test_the_vocabulary_projection_of_smollm2():
    x, w, _ = _operands(5, 49152, 576, False, seed=7)
    y = packed_gemm.packed_gemm(x, packed_gemm.pack(w), None)
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2**-8, atol=1e-3)


def test_declines_what_it_does_not_compute():
    x, w, b = _operands(3, 960, 576, True)
    assert packed_gemm.pack(w.float()) is None  # float32
    assert packed_gemm.pack(w.half()) is None  # float16
    assert packed_gemm.pack(w[:944]) is None  # N not a multiple of 32
    assert packed_gemm.pack(w[:, :575]) is None  # K odd
    assert packed_gemm.pack(w[0]) is None  # not a matrix
    if not HAS_DOTS:
        assert packed_gemm.pack(w) is None
        return
    packed = packed_gemm.pack(w)
    assert packed_gemm.packed_gemm(x.float(), packed, None) is None  # x of another dtype
    assert packed_gemm.packed_gemm(x[:, :574].contiguous(), packed, None) is None  # K of another weight
    assert packed_gemm.packed_gemm(x[:, ::2], packed, None) is None  # not contiguous
    assert packed_gemm.packed_gemm(x[:0], packed, None) is None  # no rows
    assert packed_gemm.packed_gemm(x, packed, b.float()) is None  # bias of another dtype
    assert packed_gemm.packed_gemm(x, packed, b[:32].contiguous()) is None  # bias of another length


@pytest.mark.parametrize(("n", "k"), [(960, 576), (944, 576)])
def test_the_gemm_path_multiplies_what_the_kernel_declines(n, k):
    """The path on a weight the kernel cannot pack (N not a multiple of 32), or on x not contiguous, is F.linear."""
    x, w, b = _operands(6, n, k, True, seed=3)
    path = PATHS["packed"]
    operand = path.pack(w)
    expected = F.linear(x.float(), w.float(), b.float())
    for rows in (x, torch.stack([x, x], dim=2)[:, :, 0]):  # the same values, strided
        torch.testing.assert_close(path.run(rows, operand, b).float(), expected, rtol=2**-7, atol=2e-2)
