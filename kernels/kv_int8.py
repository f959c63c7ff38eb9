"""The int8 KV cache format (``kv_cache_dtype="int8"``), shared by every backend that reads or writes it.

Each (token, kv head) row of K and of V is stored as its ``head_dim`` values quantized symmetrically to int8 with
one float32 scale, the row's absolute maximum over 127, appended as its last four bytes: a cache is an int8 tensor
``[num_blocks, block_size, num_kv_heads, head_dim + 4]``, read as ``values * scale``. With one scale a row SmolLM2
keeps its gates (tests/engine/test_quant_smollm2.py, int8 weights: greedy agreement with fp32 93.0%, perplexity
+0.83%); fp8 rows instead read 91.9%, +2.9% (E4M3) and 87.0%, +4.2% (E5M2) in a probe (2-vCPU AMD EPYC Zen 5,
2026-12-05). It buys capacity (the same memory holds 1.88x SmolLM2's tokens) and, since attention reads it with integer
products (paged_attention.c's int8 tile), speed: SmolLM2 with int8 weights offline, alternating probes on the 2-vCPU
Zen 5 VM (2026-12-07), 1,545-1,632 output tok/s against 1,293-1,497 over a bf16 cache; its decode attention is then
mostly the tile's own arithmetic (0.24 ms a layer from the L3 against 0.30 from memory).
"""

import torch

SCALE_BYTES = 4  # the row's float32 scale, after its values


def is_int8(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def head_dim_of(cache: torch.Tensor) -> int:
    """The head_dim a cache ``[blocks, block_size, Hkv, last]`` holds."""
    return cache.shape[-1] - SCALE_BYTES if is_int8(cache) else cache.shape[-1]


def row_elements(head_dim: int, dtype: torch.dtype) -> int:
    """A (token, kv head) row's elements in a cache of ``dtype``: the cache's last dimension."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows ``[..., D]`` to the stored form ``[..., D + 4]`` int8: ``round(x / scale)`` (half to even) clamped to
    +-127, scale = max |x| / 127 in float32 (0 for an all-zero row, whose values are then 0)."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    values = torch.where(scale > 0, x / scale, torch.zeros_like(x)).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([values, scale.contiguous().view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """Stored rows ``[..., D + 4]`` int8 to their float32 values ``[..., D]``."""
    values, scale = rows[..., :-SCALE_BYTES], rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    return values.float() * scale
