"""CPU paths of ``paged_attention`` and ``write_kv`` (signatures and semantics: ``kernels/__init__.py``).

Attention runs in a small C loop that reads K/V in place from the block pool (``paged_attention.c``):
gathering every sequence's context each layer would cost more than the weight GEMMs, and for prefill chunks
the loop also beats torch's SDPA with an offset causal mask (2-3x on 2 cores, measured). q and the caches may
each be float32 or bfloat16 (a build per pair; float32 arithmetic). In bf16 the dot products run on vdpbf16ps where
the CPU has AVX512-BF16, and prefill (a sequence's 8 or more queries in a step) on AMX tiles where it has AMX-BF16
(3.6x the vdpbf16ps loop on 157-token prompts; torch's SDPA in bf16 ran at a sixth of it). Without a C compiler, or
for other dtypes (float16), each sequence gathers its context and calls SDPA. An int8 cache (``kernels.kv_int8``) is
read in C beside bf16 q where the CPU has AVX512-BF16 and VNNI (integer products: vpdpwssd), and dequantized for SDPA
elsewhere.
"""

import ctypes

import torch
import torch.nn.functional as F

from kernels import kv_int8
from kernels.cpu import native, rotary_kv


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    if k.shape[0] == 0 or rotary_kv.write_kv(k, v, k_cache, v_cache, slot_mapping):
        return
    slots = slot_mapping.long()
    if bool((slots < 0).any()):
        keep = slots >= 0
        k, v, slots = k[keep], v[keep], slots[keep]
    k = kv_int8.quantize(k) if kv_int8.is_int8(k_cache) else k.to(k_cache.dtype)
    v = kv_int8.quantize(v) if kv_int8.is_int8(v_cache) else v.to(v_cache.dtype)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    _check_shapes(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    library = _native_library(q, k_cache, v_cache)
    block_tables, seq_lens, query_start_loc = _int32(block_tables), _int32(seq_lens), _int32(query_start_loc)
    if library is None or not _attend_native(library, q.contiguous(), out, k_cache, v_cache, block_tables, seq_lens,
                                             query_start_loc, scale):
        _attend_all_sdpa(q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale)
    return out


def _check_shapes(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"paged_attention: q {tuple(q.shape)} must be [T, Hq, D] and both caches "
                         f"[blocks, block_size, Hkv, D], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"paged_attention: the caches differ in dtype ({k_cache.dtype} and {v_cache.dtype})")
    if q.shape[2] != kv_int8.head_dim_of(k_cache) or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"paged_attention: q heads/dim {tuple(q.shape[1:])} do not fit cache {tuple(k_cache.shape)}")
    num_seqs = seq_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"paged_attention: {num_seqs} sequences need block_tables [{num_seqs}, max_blocks] and "
                         f"query_start_loc [{num_seqs + 1}], got {tuple(block_tables.shape)}, "
                         f"{tuple(query_start_loc.shape)}")


# what the C loop's -2 (metadata that breaks the op's contract) is raised as, here and by a recorded program
METADATA_ERROR = ("paged_attention: a sequence's queries exceed its context, its context exceeds its block table, or "
                  "a block id is outside the cache")
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
_VARIANTS = {(act, kv): tuple(f"{role}_BF16" for role, dtype in (("ACT", act), ("KV", kv)) if dtype == torch.bfloat16)
             for act in _NATIVE_DTYPES for kv in _NATIVE_DTYPES}
# an int8 cache (kernels.kv_int8) is read in C by bf16 q on CPUs with AVX512-BF16 and VNNI (-1 elsewhere)
_VARIANTS[torch.bfloat16, torch.int8] = ("ACT_BF16", "KV_INT8")


def reads_int8_in_c(act_dtype: torch.dtype) -> bool:
    """Whether the C loop reads an int8 cache (``kernels.kv_int8``) beside activations of ``act_dtype``: bf16 on a
    CPU with AVX512-BF16 and VNNI (head_dim a multiple of 32); elsewhere each sequence's context is dequantized for
    SDPA."""
    if act_dtype != torch.bfloat16:
        return False
    library = _typed(native.load("paged_attention", _VARIANTS[torch.bfloat16, torch.int8]))
    return library is not None and library.has_dots


def _int32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.int32 and x.is_contiguous() else x.to(torch.int32).contiguous()


def _native_library(q, k_cache, v_cache):
    if (q.dtype, k_cache.dtype) not in _VARIANTS or k_cache.dtype != v_cache.dtype:
        return None
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    # float32 unless -D{ACT,KV}_BF16 (vec8.h): q and out are the activations, the caches the KV.
    library = _typed(native.load("paged_attention", _VARIANTS[q.dtype, k_cache.dtype]))
    if library is not None and k_cache.dtype == torch.int8 and not library.has_dots:
        return None  # the int8 build reads its rows only where it has the vdpbf16ps path
    return library


def _typed(library):
    """The build with its entry point typed and whether it has the vdpbf16ps path, once per library."""
    if library is not None and not getattr(library, "_typed", False):
        library.paged_attention.restype = ctypes.c_int
        library.paged_attention.argtypes = (
            [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3
            + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64]
        )
        library.has_dots = bool(library.paged_attention_bf16_dots())
        library._typed = True
    return library


def _attend_native(library, q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale) -> bool:
    """The C loop over every sequence; False if a shape is outside its compiled limits (nothing written)."""
    num_seqs = seq_lens.shape[0]
    seq_ids = _all_seq_ids(num_seqs)
    status = library.paged_attention(
        q.data_ptr(), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0],
        block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(), query_start_loc.data_ptr(),
        seq_ids.data_ptr(), num_seqs, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], scale,
        torch.get_num_threads(),
    )
    if status == -2:
        raise ValueError(METADATA_ERROR)
    return status == 0


_SEQ_IDS = torch.arange(0, dtype=torch.int32)


def _all_seq_ids(num_seqs: int) -> torch.Tensor:  # [num_seqs] int32: 0, 1, ..., reused across calls
    global _SEQ_IDS
    if _SEQ_IDS.shape[0] < num_seqs:
        _SEQ_IDS = torch.arange(max(num_seqs, 2 * _SEQ_IDS.shape[0]), dtype=torch.int32)
    return _SEQ_IDS


def _attend_all_sdpa(q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale) -> None:
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        if end > start:
            out[start:end] = _attend_sdpa(q[start:end], k_cache, v_cache, block_tables[i], seq_len, scale)


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
    keys, values = k_cache[blocks].flatten(0, 1)[:seq_len], v_cache[blocks].flatten(0, 1)[:seq_len]
    if kv_int8.is_int8(k_cache):
        keys, values = kv_int8.dequantize(keys), kv_int8.dequantize(values)
    keys, values = keys.transpose(0, 1).to(q.dtype), values.transpose(0, 1).to(q.dtype)  # [Hkv, seq_len, D]
    mask = None
    if num_queries > 1:  # query j sits at position seq_len - num_queries + j
        positions = torch.arange(seq_len - num_queries, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]  # [num_queries, seq_len]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )  # [Hq, num_queries, D]
    return out.transpose(0, 1)
