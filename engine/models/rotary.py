"""Rotary position embeddings, computed with the same float32 formulas as HF so greedy outputs match exactly."""

import math

import torch
from torch import nn

from kernels.cpu import rotary_kv


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:  # [head_dim // 2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise ValueError(f"unsupported rope scaling {kind!r} (supported: default, linear, llama3)")


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions ``0..max_positions-1``; ``forward`` looks up a step's positions once."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]  # [max_pos, D/2]
        # Only the first half is kept: HF's table is cat(freqs, freqs), so both halves are equal.
        self.register_buffer("cos", freqs.cos(), persistent=False)  # [max_pos, D/2]
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) casts every float buffer: the tables stay float32 (moved, never rounded). A bfloat16
        # table rounded every angle's cos and sin, and the C rotary (kernels.cpu.rotary_kv) reads float32 tables
        # only, so a bf16 model ran the dozen torch ops instead: 7 ms of a 170 ms step at 64 tokens.
        cos, sin = self.cos, self.sin
        super()._apply(fn, recurse)
        if self.cos.dtype != torch.float32:
            self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens] -> 2 x [num_tokens, 1, D/2], broadcast over heads
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` with the two halves written separately (same float ops as HF).

    x: [num_tokens, heads, head_dim]; cos, sin: [num_tokens, 1, head_dim // 2]. On CPU one C call computes the
    same floats (``kernels.cpu.rotary_kv``): at a decode token the torch ops below cost ten times their arithmetic.
    """
    if x.device.type == "cpu":
        out = rotary_kv.rotary(x, cos, sin)
        if out is not None:
            return out
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    torch.sub(x1 * cos, x2 * sin, out=out[..., :half])
    torch.add(x2 * cos, x1 * sin, out=out[..., half:])
    return out
