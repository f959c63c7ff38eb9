"""Paged attention over the flattened varlen batch (prefill chunks and decode tokens together), GQA, causal.

One kernel serves both kinds of token. The batch is cut into query tiles of ``BLOCK_Q`` consecutive tokens of one
sequence; a program takes one tile and one KV head and packs the tile's tokens times the head's query group into
the ``BLOCK_M`` rows of its ``tl.dot`` (row ``r`` is token ``r // GROUP``, query head ``r % GROUP``), so K/V are
read once per KV head rather than once per query head. K/V are gathered through the block table ``BLOCK_N``
positions at a time (several cache blocks per step) and read in place, never copied.

A decode tile has one token, so few programs exist when the batch is small and the context long. Flash-decoding
then splits the context: ``NUM_SPLITS`` programs per tile each reduce a slice of the KV tiles to a partial
(max, sum, unnormalised output) and a second kernel merges the partials. The tile -> sequence map is found in the
kernel by binary search over ``query_start_loc``, so nothing is synchronised with the host and the launch grid
only depends on tensor shapes.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.triton.launch import Launch, check_index, check_same_device, dot_precision, num_sms

# Configs, as data: "decode" when the batch has about one query token per sequence, else "prefill". Chosen for
# no register spills on sm_90 (see ``python -m kernels.triton.aot``); not yet tuned on a GPU (bench/kernels.py).
CONFIGS = {
    "decode": {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
    "prefill": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
}
# Exact fp32 dots run on the CUDA cores and hold their operands in registers: 64x64 tiles spill kilobytes.
FP32_OVERRIDES = {"prefill": {"BLOCK_M": 32, "BLOCK_N": 32}}
MAX_NUM_SPLITS = 16
MIN_KV_TILES_PER_SPLIT = 2  # shorter splits are not worth their merge (an estimate until measured)
PROGRAMS_PER_SM = 2  # split until the GPU has about this many programs per SM
_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    # tensors
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    # sizes and scalars
    num_seqs, num_q_heads, qk_scale,
    # strides
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt_seq, stride_bt_blk,
    stride_ot, stride_oh, stride_od,
    # model shape
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    # tiling
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Sequence of this tile: the last i with query_start_loc[i] // BLOCK_Q + i <= tile. Sequence i owns the ids
    # from its own start to the next one's, at least ceil(n_i / BLOCK_Q) of them; the spare ones exit below.
    lo = num_seqs * 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_tile = tile - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len  # tokens cached before this step's queries

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    query = q_tile * BLOCK_Q + offs_m // GROUP  # [BLOCK_M] index among the sequence's queries
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (query < q_len)
    query_pos = ctx_len + query  # causal: row sees positions 0..query_pos
    token = (q_start + query).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]

    # This program's slice of the KV tiles the tile's last query can see.
    kv_end = ctx_len + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)
    num_kv_tiles = tl.cdiv(kv_end, BLOCK_N)
    tiles_per_split = tl.cdiv(num_kv_tiles, NUM_SPLITS)
    first = split * tiles_per_split
    last = tl.minimum(first + tiles_per_split, num_kv_tiles)

    # Finite start so rows with nothing visible yet give exp2(-inf - m) = 0, never NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for j in range(first, last):
        pos = j * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] context positions
        pos_ok = pos < kv_end
        block = tl.load(block_table + (pos // PAGE_SIZE) * stride_bt_blk, mask=pos_ok, other=0).to(tl.int64)
        in_block = pos % PAGE_SIZE
        k_off = block * stride_kb + in_block * stride_ks + kv_head * stride_kh
        k = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None] * stride_kd,
                    mask=pos_ok[None, :] & d_ok[:, None], other=0.0)  # [HEAD_DIM_PAD, BLOCK_N]
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
        visible = (pos[None, :] <= query_pos[:, None]) & pos_ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = block * stride_vb + in_block * stride_vs + kv_head * stride_vh
        v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :] * stride_vd,
                    mask=pos_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, HEAD_DIM_PAD]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    store_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        part = (token * num_q_heads + head) * NUM_SPLITS + split  # [BLOCK_M] row of the partials
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=store_mask)


@triton.jit
def _paged_attention_merge_kernel(
    # tensors
    part_out_ptr, part_max_ptr, part_sum_ptr, out_ptr,
    # sizes
    num_q_heads,
    # strides
    stride_ot, stride_oh, stride_od,
    # shape and tiling
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    part = (token * num_q_heads + head) * NUM_SPLITS + offs_s  # [NUM_SPLITS]
    m = tl.load(part_max_ptr + part)
    weight = tl.exp2(m - tl.max(m, 0))  # splits that saw nothing have m = -1e30 and weigh 0
    total = tl.sum(weight * tl.load(part_sum_ptr + part), 0)
    acc = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / total  # [HEAD_DIM_PAD]
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=d_ok)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    """Causal attention of each sequence's last ``query_start_loc[i+1]-query_start_loc[i]`` tokens over its whole
    context, read in place from the paged cache (see ``kernels.reference.paged_attention``)."""
    _check(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous even when q is a view of fused qkv
    config = choose_config(q, k_cache, block_tables)
    for launch in plan(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out, config):
        launch.run(q.device)
    return out


def choose_config(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor) -> dict:
    """Tiling for this batch from shapes alone: decode tiles when there is about one query per sequence, and
    enough context splits to give every SM work when the tiles alone do not."""
    num_tokens, num_q_heads, num_seqs = q.shape[0], q.shape[1], block_tables.shape[0]
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    config = base_config("decode" if num_tokens <= 2 * num_seqs else "prefill", q.dtype)
    group = num_q_heads // num_kv_heads
    block_q = max(config["BLOCK_M"], triton.next_power_of_2(group)) // group
    programs = (num_tokens // block_q + num_seqs) * num_kv_heads
    max_kv_tiles = triton.cdiv(block_tables.shape[1] * page_size, config["BLOCK_N"])
    num_splits = 1
    while (num_splits < MAX_NUM_SPLITS and programs * num_splits * 2 <= PROGRAMS_PER_SM * num_sms(q.device)
           and max_kv_tiles >= 2 * num_splits * MIN_KV_TILES_PER_SPLIT):
        num_splits *= 2
    config["NUM_SPLITS"] = num_splits
    return config


def base_config(kind: str, dtype: torch.dtype) -> dict:
    """``CONFIGS[kind]`` with the fp32 overrides applied when ``dtype`` is fp32."""
    return {**CONFIGS[kind], **(FP32_OVERRIDES.get(kind, {}) if dtype == torch.float32 else {})}


def plan(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out, config) -> list[Launch]:
    """The launches that compute ``out`` with ``config`` (a dict like ``CONFIGS[...]`` plus ``NUM_SPLITS``)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    block_m = max(config["BLOCK_M"], triton.next_power_of_2(group))  # at least one token per tile
    block_q = block_m // group
    num_splits = config["NUM_SPLITS"]
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    if num_splits > 1:
        part_out = torch.empty(num_tokens, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(num_tokens, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:  # unused by the kernel; any pointer will do
        part_out = part_max = part_sum = out
    attention = Launch(
        _paged_attention_kernel,
        grid=(num_tokens // block_q + block_tables.shape[0], num_kv_heads, num_splits),
        args=(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_max, part_sum,
              block_tables.shape[0], num_q_heads, scale * _LOG2E,
              *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride()),
        constexprs=dict(GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, PAGE_SIZE=k_cache.shape[1],
                        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=config["BLOCK_N"],
                        NUM_SPLITS=num_splits, DOT_PRECISION=dot_precision(q.dtype)),
        options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]),
    )
    if num_splits == 1:
        return [attention]
    merge = Launch(
        _paged_attention_merge_kernel,
        grid=(num_tokens, num_q_heads),
        args=(part_out, part_max, part_sum, out, num_q_heads, *out.stride()),
        constexprs=dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_SPLITS=num_splits),
        options=dict(num_warps=1),
    )
    return [attention, merge]


def _check(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc) -> None:
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens,
                      query_start_loc=query_start_loc)
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [tokens, heads, dim] and k_cache [blocks, block_size, kv_heads, dim], "
                         f"got {list(q.shape)} and {list(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {list(v_cache.shape)} != k_cache shape {list(k_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype) or q.dtype not in (torch.float32, torch.float16,
                                                                         torch.bfloat16):
        raise ValueError(f"q, k_cache, v_cache must share one of fp32/fp16/bf16, got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    num_q_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if q.shape[2] != k_cache.shape[3] or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q heads/dim {list(q.shape[1:])} do not fit kv heads/dim {list(k_cache.shape[2:])}")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be [num_seqs], got {list(seq_lens.shape)}")
    num_seqs = seq_lens.shape[0]
    check_index("seq_lens", seq_lens, torch.int32, (num_seqs,))
    check_index("query_start_loc", query_start_loc, torch.int32, (num_seqs + 1,))
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be int32 [num_seqs={num_seqs}, max_blocks], "
                         f"got {block_tables.dtype} {list(block_tables.shape)}")
    if math.prod(q.shape) and block_tables.shape[1] == 0:
        raise ValueError("block_tables has no columns but there are queries")
