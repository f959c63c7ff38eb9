"""CPU paths of ``paged_attention`` and ``write_kv`` (signatures and semantics: ``kernels/__init__.py``).

Short query runs (decode tokens, small chunks) go to a C loop that reads K/V in place from the block pool
(``paged_attention.c``): gathering every sequence's context each layer would cost more than the weight GEMMs.
Long query runs (prefill chunks) gather their context once and use torch's blocked SDPA, whose GEMM kernels
beat a plain loop when there are many queries per key. Without a C compiler (or for non-fp32 tensors) every
sequence takes the SDPA path.
"""

import ctypes
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.cpu import native

# Sequences with at least this many queries in a step use SDPA (measured crossover on 2 cores, fp32).
SDPA_MIN_QUERIES = 16


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    if k.shape[0] == 0:
        return
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        k, v, slots = k[keep], v[keep], slots[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


@dataclass(slots=True)
class _Plan:
    """How one step's sequences are split between the C loop and SDPA.

    Built once per step: every layer receives the same metadata tensor objects, so the plan is memoized on
    their identity (and version counter, where torch keeps one).
    """

    native_seq_ids: torch.Tensor  # [n] int32
    sdpa_seqs: list[tuple[int, int, int, int]]  # (seq index, first token, num queries, context length)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, contiguous
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32


_last_plan: tuple[tuple, _Plan] | None = None


def _plan(block_tables, seq_lens, query_start_loc, use_native: bool) -> _Plan:
    global _last_plan
    key = (use_native, *((weakref.ref(t), _version(t)) for t in (block_tables, seq_lens, query_start_loc)))
    if _last_plan is not None and _same_key(_last_plan[0], key):
        return _last_plan[1]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    native_ids, sdpa = [], []
    for i, seq_len in enumerate(lens):
        num_queries = starts[i + 1] - starts[i]
        if num_queries == 0:
            continue
        if use_native and num_queries < SDPA_MIN_QUERIES:
            native_ids.append(i)
        else:
            sdpa.append((i, starts[i], num_queries, seq_len))
    plan = _Plan(
        torch.tensor(native_ids, dtype=torch.int32), sdpa,
        block_tables.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous(),
        query_start_loc.to(torch.int32).contiguous(),
    )
    _last_plan = (key, plan)
    return plan


def _version(tensor: torch.Tensor) -> int:
    # Inference tensors keep no version counter; the engine never edits a step's metadata in place.
    return -1 if tensor.is_inference() else tensor._version


def _same_key(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    return all(x[0]() is not None and x[0]() is y[0]() and x[1] == y[1] for x, y in zip(a[1:], b[1:], strict=True))


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    library = _native_library(q, k_cache, v_cache)
    plan = _plan(block_tables, seq_lens, query_start_loc, library is not None)
    out = torch.empty_like(q)
    if plan.native_seq_ids.numel():
        _attend_native(library, q.contiguous(), out, k_cache, v_cache, plan, scale)
    for index, start, num_queries, seq_len in plan.sdpa_seqs:
        out[start : start + num_queries] = _attend_sdpa(
            q[start : start + num_queries], k_cache, v_cache, plan.block_tables[index], seq_len, scale
        )
    return out


def _native_library(q, k_cache, v_cache):
    if not (q.dtype == k_cache.dtype == v_cache.dtype == torch.float32):
        return None
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    library = native.load("paged_attention")
    if library is not None and not getattr(library, "_typed", False):
        library.paged_attention_f32.restype = ctypes.c_int
        library.paged_attention_f32.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] + [ctypes.c_void_p] * 3 + [
            ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64]
        library._typed = True
    return library


def _attend_native(library, q, out, k_cache, v_cache, plan: _Plan, scale: float) -> None:
    status = library.paged_attention_f32(
        q.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        plan.block_tables.data_ptr(), plan.block_tables.shape[1], plan.seq_lens.data_ptr(),
        plan.query_start_loc.data_ptr(), plan.native_seq_ids.data_ptr(), plan.native_seq_ids.numel(),
        q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], scale, torch.get_num_threads(),
    )
    if status != 0:  # shapes above the C loop's limits: fall back, still correct
        starts = plan.query_start_loc.tolist()
        for index in plan.native_seq_ids.tolist():
            start, end = starts[index], starts[index + 1]
            seq_len = int(plan.seq_lens[index])
            out[start:end] = _attend_sdpa(q[start:end], k_cache, v_cache, plan.block_tables[index], seq_len, scale)


def _attend_sdpa(
    q: torch.Tensor,  # [num_queries, num_q_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks] int32
    seq_len: int,
    scale: float,
) -> torch.Tensor:  # [num_queries, num_q_heads, head_dim]
    block_size, num_queries = k_cache.shape[1], q.shape[0]
    blocks = block_table[: (seq_len + block_size - 1) // block_size].long()
    keys = k_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)  # [Hkv, seq_len, D]
    values = v_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)
    mask = None
    if num_queries > 1:  # query j sits at position seq_len - num_queries + j
        positions = torch.arange(seq_len - num_queries, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]  # [num_queries, seq_len]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )  # [Hq, num_queries, D]
    return out.transpose(0, 1)
