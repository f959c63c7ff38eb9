"""Operands of a projection's GEMM for the kernel tests: x [m, k] and a weight [n, k] scaled like a layer's, bf16."""

import torch


def bf16_operands(m: int, n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b
