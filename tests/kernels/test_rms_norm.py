"""The C RMSNorm (+ residual add) of kernels/cpu/rms_norm.c against torch's bfloat16 and float32 ops."""

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import native, rms_norm


@pytest.fixture(autouse=True)
def built():
    """Built when a test runs, not at collection (a loaded library's constructors run in the loading thread)."""
    if native.load("rms_norm", ("ACT_BF16",)) is None or native.load("rms_norm") is None:
        pytest.skip("no C compiler")


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 steps apart each pair is (same-sign finite values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("rows, hidden", [(1, 576), (7, 576), (64, 576), (300, 576), (3, 40), (2, 4096)])
def test_rms_norm_matches_torch_and_adds_the_residual_in_place(rows, hidden):
    generator = torch.Generator().manual_seed(rows * hidden)
    x = (torch.randn(rows, hidden, generator=generator) * 3).bfloat16()
    delta = torch.randn(rows, hidden, generator=generator).bfloat16()
    weight = (torch.rand(hidden, generator=generator) + 0.5).bfloat16()
    expected_x = x + delta
    expected = F.rms_norm(expected_x, (hidden,), weight, 1e-5)

    out = rms_norm.add_rms_norm(x, delta, weight, 1e-5)

    assert torch.equal(x, expected_x)  # the residual stream took the add, rounded as torch rounds it
    # one rounding of x * rstd * w, as torch's: only the order of the float32 sum of squares differs
    assert int(ulps_apart(out, expected).max()) <= 1
    assert (out != expected).float().mean() < 1e-3
    plain = rms_norm.add_rms_norm(expected_x.clone(), None, weight, 1e-5)
    assert torch.equal(plain, out)


@pytest.mark.parametrize("rows, hidden", [(1, 576), (7, 576), (64, 576), (300, 576), (3, 40), (2, 4096)])
def test_float32_rms_norm_matches_torch_to_the_sums_order_and_adds_exactly(rows, hidden):
    generator = torch.Generator().manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, generator=generator) * 3
    delta = torch.randn(rows, hidden, generator=generator)
    weight = torch.rand(hidden, generator=generator) + 0.5
    expected_x = x + delta
    expected = F.rms_norm(expected_x, (hidden,), weight, 1e-5)
    exact = F.rms_norm(expected_x.double(), (hidden,), weight.double(), 1e-5)

    out = rms_norm.add_rms_norm(x, delta, weight, 1e-5)

    assert torch.equal(x, expected_x)  # float32 adds are IEEE's in both
    # within a few float32 units of the float64 result, and so of torch's: the sums of squares differ in order
    torch.testing.assert_close(out.double(), exact, rtol=4e-7, atol=0)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0)
    assert torch.equal(rms_norm.add_rms_norm(expected_x.clone(), None, weight, 1e-5), out)


def test_nan_spreads_through_the_row_as_in_torch():
    x = torch.tensor([[float("nan")] + [1.0] * 7, [1.0] * 8]).bfloat16()
    out = rms_norm.add_rms_norm(x, None, torch.ones(8).bfloat16(), 1e-5)
    assert out[0].isnan().all() and torch.equal(out[1], F.rms_norm(x[1:], (8,), torch.ones(8).bfloat16(), 1e-5)[0])


def test_what_it_does_not_take_is_left_to_torch():
    weight = torch.ones(8).bfloat16()
    assert rms_norm.add_rms_norm(torch.ones(2, 8), None, weight, 1e-5) is None  # float32 x, bfloat16 weight
    assert rms_norm.add_rms_norm(torch.ones(2, 8).half(), None, weight.half(), 1e-5) is None  # float16
    assert rms_norm.add_rms_norm(torch.ones(8, 2).bfloat16().t(), None, weight, 1e-5) is None  # not contiguous
    x = torch.ones(2, 8).bfloat16()
    assert rms_norm.add_rms_norm(x, torch.ones(2, 4).bfloat16(), weight, 1e-5) is None  # delta of another shape
    assert rms_norm.add_rms_norm(x, torch.ones(2, 8), weight, 1e-5) is None  # delta of another dtype
    assert torch.equal(x, torch.ones(2, 8).bfloat16())  # nothing was added
