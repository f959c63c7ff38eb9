"""The C SiLU-and-multiply of kernels/cpu/silu_mul.c against torch's ``F.silu(gate) * up`` in bfloat16 and float32,
and the MLP that calls it."""

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_info import cpu_info
from kernels.cpu import native, silu_mul

SPECIAL = [0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30, float("inf"), float("-inf"), float("nan"), 88.5, -88.5, -87.0]


HAS_KERNEL = {"avx512f", "avx512bw"} <= cpu_info().flags or {"avx2", "fma"} <= cpu_info().flags


@pytest.fixture(autouse=True)
def built(request):
    """Built when a test runs, not at collection (a loaded library's constructors run in the loading thread)."""
    if native.load("silu_mul", ("ACT_BF16",)) is None or native.load("silu_mul") is None:
        pytest.skip("no C compiler")
    if not HAS_KERNEL and request.node.name != "test_runs_exactly_where_the_cpu_has_the_instructions":
        pytest.skip("the kernel runs on CPUs with AVX-512 or AVX2 + FMA only (torch's ops elsewhere)")


def test_runs_exactly_where_the_cpu_has_the_instructions():
    assert (silu_mul.silu_mul(torch.randn(2, 64)) is not None) == HAS_KERNEL


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
    return F.silu(gate) * up


def gate_up_of(rows: int, size: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2 * size, generator=generator) * 3).to(dtype)


@pytest.mark.parametrize("rows, size", [(1, 1536), (7, 1536), (64, 1536), (300, 1536), (3, 40), (2, 8)])
def test_bfloat16_has_torchs_two_roundings(rows, size):
    """silu rounds to bf16, then the product does, as torch's two ops round: only the exp's last float32 bits differ
    from torch's, which may tip a silu lying that close to a rounding boundary by one bf16 unit (two in the product)."""
    gate_up = gate_up_of(rows, size, torch.bfloat16, rows * size)
    out = silu_mul.silu_mul(gate_up)
    expected = torch_silu_mul(gate_up)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, size)
    apart = (out.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    assert int(apart.max()) <= 2
    assert float((apart > 0).float().mean()) < 2e-3
    # against float64 silu with the same two roundings: as close as torch is
    exact = gate_up.double()
    silu = (exact[:, :size] * torch.sigmoid(exact[:, :size])).to(torch.bfloat16).float()
    reference = (silu * gate_up[:, size:].float()).to(torch.bfloat16)
    ours = (out.view(torch.int16).int() - reference.view(torch.int16).int()).abs()
    torchs = (expected.view(torch.int16).int() - reference.view(torch.int16).int()).abs()
    assert int(ours.max()) <= 2 and float((ours > 0).float().mean()) <= float((torchs > 0).float().mean()) + 2e-3


@pytest.mark.parametrize("rows, size", [(1, 1536), (64, 1536), (5, 40)])
def test_float32_within_a_few_units_of_the_exact_value(rows, size):
    gate_up = gate_up_of(rows, size, torch.float32, rows + size)
    out = silu_mul.silu_mul(gate_up)
    exact = gate_up.double()
    reference = exact[:, :size] * torch.sigmoid(exact[:, :size]) * exact[:, size:]
    assert float(((out.double() - reference).abs() / reference.abs().clamp_min(1e-30)).max()) < 1e-6
    assert torch.allclose(out, torch_silu_mul(gate_up), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_special_values_as_torch(dtype):
    """Below -88 (where torch's exp(-x) overflows from -88.72 on) a zero of x's sign, NaN for -inf, as torch's
    x / inf; between -88.72 and -88 torch's result is itself below 1e-36 in size; inf and NaN propagate."""
    size = 32  # the first 16 on the vector path, the next 16 too; the tail path is the 40-wide case's
    gate_up = torch.full((1, 2 * size), 1.5)
    gate_up[0, :len(SPECIAL)] = torch.tensor(SPECIAL)
    gate_up[0, 16:16 + len(SPECIAL)] = torch.tensor(SPECIAL)
    gate_up = gate_up.to(dtype)
    tail = torch.full((1, 2 * 20), 1.5, dtype=dtype)  # 20 wide: 16 on the vector path, 4 scalar
    tail[0, 16:20] = torch.tensor(SPECIAL[6:10], dtype=dtype)
    for x in (gate_up, tail):
        out, expected = silu_mul.silu_mul(x), torch_silu_mul(x)
        assert torch.equal(out.isnan(), expected.isnan())
        finite = ~expected.isnan()
        out, expected = out[finite], expected[finite]
        tiny = expected.abs() < 1e-36
        assert torch.allclose(out[~tiny], expected[~tiny], rtol=1e-6 if dtype == torch.float32 else 0, atol=0)
        assert bool((out[tiny].abs() < 1e-36).all())
        assert torch.equal(torch.signbit(out), torch.signbit(expected))


def test_rows_alone_give_the_same_bits_as_the_threaded_batch():
    gate_up = gate_up_of(300, 1536, torch.bfloat16, 3)
    whole = silu_mul.silu_mul(gate_up)
    assert torch.equal(torch.cat([silu_mul.silu_mul(gate_up[i:i + 1].clone()) for i in (0, 150, 299)]),
                       whole[[0, 150, 299]])
    assert silu_mul.silu_mul(gate_up[:0]).shape == (0, 1536)


def test_declines_what_it_cannot_take():
    x = torch.randn(4, 64)
    assert silu_mul.silu_mul(x.half()) is None
    assert silu_mul.silu_mul(x[:, :63]) is None  # odd width: no gate/up halves
    assert silu_mul.silu_mul(x.t()) is None  # not contiguous
    assert silu_mul.silu_mul(x[0]) is None  # not [T, 2I]
