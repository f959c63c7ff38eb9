"""The C argmax of kernels/cpu/argmax.c (greedy sampling) gives torch.argmax(dim=-1)'s answer on every kind of row."""

import pytest
import torch

from kernels.cpu import argmax, native


@pytest.fixture(autouse=True)
def built():
    """Built when a test runs, not at collection (a loaded library's constructors run in the loading thread)."""
    if native.load("argmax") is None:
        pytest.skip("no C compiler")


@pytest.mark.parametrize("rows, n", [(64, 49152), (1, 49152), (3, 1), (5, 17), (2, 31), (2, 32), (7, 1000)])
def test_random_rows_as_torch(rows, n):
    logits = torch.randn(rows, n, generator=torch.Generator().manual_seed(rows * n))
    assert torch.equal(argmax.argmax_rows(logits), logits.argmax(dim=-1))


def rows_of_every_kind(n: int) -> torch.Tensor:
    nan, inf = float("nan"), float("inf")
    rows = torch.zeros(12, n)
    rows[1] = -inf  # all -inf: index 0
    rows[2, [5 % n, (n - 3) % n, n - 1]] = 7.0  # ties: the first
    rows[3, n - 1] = inf  # the last element
    rows[4, [3 % n, (n - 2) % n]] = nan  # NaN above everything: the first NaN
    rows[4, 1 % n] = inf
    rows[5, 0] = nan  # NaN first
    rows[6] = torch.arange(n, dtype=torch.float32)  # increasing: the last
    rows[7] = -torch.arange(n, dtype=torch.float32)  # decreasing: the first
    rows[8, 20 % n] = -0.0  # -0 equals 0: still the first zero
    rows[9, 40 % n] = 1e-45  # a denormal above zero
    rows[10, (n * 3) // 4] = nan  # a NaN in the vector part only
    rows[11, 16 % n] = 3.0  # ties across lanes: one in lane 0 of the second vector, one later
    rows[11, (16 + 33) % n] = 3.0
    return rows


@pytest.mark.parametrize("n", [1, 15, 16, 33, 48, 100, 4096])
def test_ties_nan_inf_and_signed_zeros_as_torch(n):
    logits = rows_of_every_kind(n)
    assert torch.equal(argmax.argmax_rows(logits), logits.argmax(dim=-1))


def test_declines_what_it_cannot_take():
    logits = torch.randn(4, 64)
    assert argmax.argmax_rows(logits.bfloat16()) is None
    assert argmax.argmax_rows(logits.t()) is None
    assert argmax.argmax_rows(logits[0]) is None
    assert argmax.argmax_rows(torch.empty(3, 0)) is None
    assert argmax.argmax_rows(torch.empty(0, 64)).shape == (0,)
