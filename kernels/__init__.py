"""Kernels the engine runs every step, each behind one public function.

Every op has three implementations with the same signature:
  * ``kernels.reference``: plain, obviously correct torch; used only by tests as the oracle;
  * ``kernels.cpu``: fast torch for CPUs (no per-layer copy of the whole context, no per-token Python loops);
  * ``kernels.triton``: Triton kernels for CUDA (tested on CPU through ``TRITON_INTERPRET=1``).

The backend follows the tensors' device (CUDA -> triton, otherwise cpu) unless ``KERNELS_BACKEND``
(``reference`` | ``cpu`` | ``triton``) or :func:`use_backend` says otherwise.
"""

import os
from contextlib import contextmanager
from importlib import import_module

import torch

BACKENDS = ("reference", "cpu", "triton")
_forced: str | None = None


def _env_backend() -> str | None:
    value = os.environ.get("KERNELS_BACKEND", "").strip().lower() or None
    if value is not None and value not in BACKENDS:
        raise ValueError(f"KERNELS_BACKEND must be one of {BACKENDS}, got {value!r}")
    return value


def backend_for(device: torch.device) -> str:
    """The backend that runs ops on tensors of ``device``."""
    forced = _forced or _env_backend()
    if forced is not None:
        return forced
    return "triton" if device.type == "cuda" else "cpu"


@contextmanager
def use_backend(name: str | None):
    """Force a backend for the duration of a ``with`` block (tests, benchmarks)."""
    global _forced
    if name is not None and name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    previous, _forced = _forced, name
    try:
        yield
    finally:
        _forced = previous


_MODULES: dict[str, object] = {}


def _impl(op: str, device: torch.device):
    # Called for every op of every layer: the backend's module is looked up once, not imported again each time.
    backend = backend_for(device)
    module = _MODULES.get(backend)
    if module is None:
        module = _MODULES[backend] = import_module(f"kernels.{backend}")
    return getattr(module, op)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    """Causal attention of each sequence's last ``query_start_loc[i+1]-query_start_loc[i]`` tokens over
    its whole context, read in place from the paged cache (grouped-query attention allowed). An int8 cache holds
    ``kernels.kv_int8``'s rows (last dimension head_dim + 4; CPU backends)."""
    return _impl("paged_attention", q.device)(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64, block_id * block_size + offset; -1 = skip
) -> None:
    """Scatter this step's new keys and values into their cache slots, in place (quantized into an int8 cache's
    rows: ``kernels.kv_int8``)."""
    _impl("write_kv", k.device)(k, v, k_cache, v_cache, slot_mapping)


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, max_rank, in_features]
    token_slots: torch.Tensor,  # [num_tokens] int32, -1 = no adapter
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32, rank of each slot's adapter
    num_slices: int = 1,
) -> torch.Tensor:  # [num_tokens, max_rank] float32
    """``h[t] = lora_a[token_slots[t]] @ x[t]`` in fp32; rows of tokens without an adapter are zero.

    A fused projection (q/k/v, gate/up) stacks its parts' A matrices on the rank axis: ``num_slices`` equal parts
    of ``max_rank``. ``slot_ranks`` says how many rows of each part a slot uses (the rest is zero padding, which a
    backend may skip)."""
    return _impl("lora_shrink", x.device)(x, lora_a, token_slots, slot_ranks=slot_ranks, num_slices=num_slices)


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place
    h: torch.Tensor,  # [num_tokens, num_slices * max_rank]
    lora_b: torch.Tensor,  # [num_slots, out_features, max_rank]
    token_slots: torch.Tensor,  # [num_tokens] int32, -1 = no adapter
    scales: torch.Tensor,  # [num_slots] float32
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32, rank of each slot's adapter
    slices: tuple[int, ...] | None = None,  # output sizes of a fused projection's parts, summing to out_features
) -> None:
    """``y[t] += scales[s] * lora_b[s] @ h[t]`` with ``s = token_slots[t]``; tokens with -1 are untouched.

    With ``slices``, part ``i`` of ``y`` (and of ``lora_b``'s output axis) takes columns ``i * max_rank`` to
    ``(i + 1) * max_rank`` of ``h``: what :func:`lora_shrink` with ``num_slices = len(slices)`` returns."""
    _impl("lora_expand", y.device)(y, h, lora_b, token_slots, scales, slot_ranks=slot_ranks, slices=slices)
