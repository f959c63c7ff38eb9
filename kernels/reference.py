"""Plain, obviously correct torch versions of every op: the oracle the tests compare the fast paths with.

Slow on purpose (Python loops over sequences and tokens); never used by the engine.
"""

import torch

from kernels import kv_int8


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    num_q_heads, block_size, num_kv_heads = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros_like(q)
    for i in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        seq_len, num_queries = int(seq_lens[i]), end - start
        if num_queries == 0:
            continue
        positions = torch.arange(seq_len)
        blocks = block_tables[i].long()[positions // block_size]
        keys = _rows(k_cache[blocks, positions % block_size])  # [seq_len, num_kv_heads, head_dim] float32
        values = _rows(v_cache[blocks, positions % block_size])
        keys = keys.repeat_interleave(group, dim=1)  # [seq_len, num_q_heads, head_dim]
        values = values.repeat_interleave(group, dim=1)
        for j in range(num_queries):
            query_pos = seq_len - num_queries + j  # causal: sees positions 0..query_pos
            scores = torch.einsum("hd,khd->hk", q[start + j].float(), keys[: query_pos + 1]) * scale
            probs = torch.softmax(scores, dim=-1)
            out[start + j] = torch.einsum("hk,khd->hd", probs, values[: query_pos + 1]).to(q.dtype)
    return out


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    block_size = k_cache.shape[1]
    for t in range(k.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = kv_int8.quantize(k[t]) if kv_int8.is_int8(k_cache) else k[t]
        v_cache[slot // block_size, slot % block_size] = kv_int8.quantize(v[t]) if kv_int8.is_int8(v_cache) else v[t]


def _rows(cached: torch.Tensor) -> torch.Tensor:  # a cache's rows as float32 values (kernels.kv_int8 for int8)
    return kv_int8.dequantize(cached) if kv_int8.is_int8(cached) else cached.float()


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, max_rank, in_features]; num_slices equal parts when fused
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32
    num_slices: int = 1,
) -> torch.Tensor:  # [num_tokens, max_rank] float32
    h = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        slot = int(token_slots[t])
        if slot >= 0:
            h[t] = _used_rows(lora_a[slot], slot_ranks, slot, num_slices).float() @ x[t].float()
    return h


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place
    h: torch.Tensor,  # [num_tokens, num_slices * max_rank]
    lora_b: torch.Tensor,  # [num_slots, out_features, max_rank]
    token_slots: torch.Tensor,  # [num_tokens] int32; -1 = no adapter
    scales: torch.Tensor,  # [num_slots] float32
    *,
    slot_ranks: torch.Tensor | None = None,  # [num_slots] int32
    slices: tuple[int, ...] | None = None,  # output sizes of a fused projection's parts
) -> None:
    max_rank, offset = lora_b.shape[2], 0
    for i, size in enumerate(slices or (y.shape[1],)):  # part i: its columns of y and lora_b, its slice of h
        y_part, b_part = y[:, offset : offset + size], lora_b[:, offset : offset + size]
        h_part = h[:, i * max_rank : (i + 1) * max_rank]
        offset += size
        for t in range(y.shape[0]):
            slot = int(token_slots[t])
            if slot >= 0:
                b = _used_rows(b_part[slot].t(), slot_ranks, slot, 1).t()  # [size, max_rank]
                delta = float(scales[slot]) * (b.float() @ h_part[t].float())
                y_part[t] += delta.to(y.dtype)


def _used_rows(weight: torch.Tensor, slot_ranks, slot: int, num_slices: int) -> torch.Tensor:
    """``weight`` ([num_slices * max_rank, n]) with the rows past the slot's rank in each slice zeroed."""
    if slot_ranks is None:
        return weight
    rank, part = int(slot_ranks[slot]), weight.shape[0] // num_slices
    keep = (torch.arange(weight.shape[0], device=weight.device) % part < rank)[:, None]
    return torch.where(keep, weight, torch.zeros((), dtype=weight.dtype, device=weight.device))
