"""The C rotary embedding and KV cache write of ``rotary_kv.c``, for float32 and bfloat16 tensors on CPU (and int8
KV caches, ``kernels.kv_int8``: rows quantized as they are written).

Each returns None (rotary, rotary_qkv) or False (write_kv) where the C build is missing or a tensor's dtype or layout
is not one it reads, and the caller runs its torch formulas: the results are the same bit for bit either way
(tests/kernels/test_rotary_kv.py), only the number of ops differs.
"""

import ctypes

import torch

from kernels import kv_int8
from kernels.cpu import native

_TYPES = (torch.float32, torch.bfloat16)
_P, _I = ctypes.c_void_p, ctypes.c_int64
# (activations, KV cache) dtype -> the build's -D flags (vec8.h)
_VARIANTS = {
    (act, kv): tuple(f"{role}_BF16" for role, dtype in (("ACT", act), ("KV", kv)) if dtype == torch.bfloat16)
    for act in _TYPES
    for kv in _TYPES
}
for _act in _TYPES:  # int8 caches (kernels.kv_int8): rows quantized as they are written
    _VARIANTS[_act, torch.int8] = (*_VARIANTS[_act, torch.float32], "KV_INT8")
_KV_TYPES = (*_TYPES, torch.int8)


def _library(act: torch.dtype, kv: torch.dtype):
    """The build for activations ``act`` (float32 or bfloat16) and a KV cache ``kv`` (those or int8), typed on first
    use. ``native.load`` caches it (and says None while native kernels are off)."""
    variant = _VARIANTS[act, kv]
    library = native.load("rotary_kv", variant)
    if library is not None and not getattr(library, "_typed", False):
        library.rotary.restype = None
        library.rotary.argtypes = [_P, _I, _I, _I, _I, _P, _P, _P]
        library.write_kv.restype = ctypes.c_int
        library.write_kv.argtypes = [_P, _I, _P, _I, _I, _I, _I, _P, _P, _P, _I]
        library.rotary_qkv.restype = ctypes.c_int
        library.rotary_qkv.argtypes = [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _I]
        library._typed = True
    return library


def _are_tables(cos: torch.Tensor, sin: torch.Tensor, num_tokens: int, head_dim: int) -> bool:
    """cos and sin are the [T, 1, D // 2] float32 rows the C code reads (D even)."""
    half = head_dim // 2
    table, strides = (num_tokens, 1, half), (half, half, 1)
    return (not head_dim % 2 and cos.dtype == torch.float32 and sin.dtype == torch.float32 and cos.shape == table
            and sin.shape == table and cos.stride() == strides and sin.stride() == strides)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """``engine.models.rotary.apply_rotary`` in one C call; None where it does not apply.

    x: [T, H, D] on CPU, each token's heads contiguous (a view of the fused q/k/v output is); cos, sin:
    [T, 1, D // 2] float32 rows. Few checks, each cheap: at a decode token they are most of the call's time."""
    num_tokens, num_heads, head_dim = x.shape
    if x.dtype not in _TYPES or x.stride()[1:] != (head_dim, 1) or not _are_tables(cos, sin, num_tokens, head_dim):
        return None
    library = _library(x.dtype, x.dtype)
    if library is None:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    library.rotary(
        x.data_ptr(), x.stride(0), num_tokens, num_heads, head_dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr()
    )
    return out


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> bool:
    """``kernels.write_kv`` in one C call; False (nothing written) where it does not apply. IndexError for a slot
    past the cache, as torch's ``index_copy_`` would refuse it."""
    rows = k.shape[1:]
    if (
        k.dtype not in _TYPES
        or v.dtype != k.dtype
        or k_cache.dtype not in _KV_TYPES
        or v_cache.dtype != k_cache.dtype
        or v.shape != k.shape
        or k_cache.shape[2:] != (rows[0], kv_int8.row_elements(rows[1], k_cache.dtype))
        or v_cache.shape != k_cache.shape
        or k.stride()[1:] != (rows[1], 1)
        or v.stride()[1:] != (rows[1], 1)
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or slot_mapping.dtype != torch.int64
        or slot_mapping.shape != k.shape[:1]
        or slot_mapping.stride() != (1,)
    ):
        return False
    library = _library(k.dtype, k_cache.dtype)
    if library is None:
        return False
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    status = library.write_kv(
        k.data_ptr(),
        k.stride(0),
        v.data_ptr(),
        v.stride(0),
        k.shape[0],
        k.shape[1],
        k.shape[2],
        slot_mapping.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        num_slots,
    )
    if status != 0:
        raise IndexError(f"write_kv: a slot in slot_mapping is past the cache's {num_slots} slots")
    return True


def rotary_qkv(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int, cos: torch.Tensor,
               sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slot_mapping: torch.Tensor) -> torch.Tensor | None:
    """One layer's rotary and KV write from its fused q/k/v output in one C call: q rotated ([T, Hq, D], returned),
    k rotated and v written to their cache slots. The same numbers as splitting ``qkv``, :func:`rotary` of q and of k,
    then :func:`write_kv`; None (nothing written) where it does not apply. IndexError for a slot past the cache.

    qkv: [T, (Hq + 2 Hkv) * D] with unit stride along the row; cos, sin: [T, 1, D // 2] float32 rows; the caches
    [blocks, block_size, Hkv, D] (int8: D + 4, ``kernels.kv_int8``), contiguous; slot_mapping [T] int64."""
    num_tokens = qkv.shape[0]
    if (
        qkv.dtype not in _TYPES
        or qkv.dim() != 2
        or qkv.stride(1) != 1
        or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim
        or not _are_tables(cos, sin, num_tokens, head_dim)
        or k_cache.dtype not in _KV_TYPES
        or v_cache.dtype != k_cache.dtype
        or k_cache.shape[2:] != (num_kv_heads, kv_int8.row_elements(head_dim, k_cache.dtype))
        or v_cache.shape != k_cache.shape
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or slot_mapping.dtype != torch.int64
        or slot_mapping.shape != (num_tokens,)
        or slot_mapping.stride() != (1,)
    ):
        return None
    library = _library(qkv.dtype, k_cache.dtype)
    if library is None:
        return None
    q = torch.empty(num_tokens, num_q_heads, head_dim, dtype=qkv.dtype)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    status = library.rotary_qkv(qkv.data_ptr(), qkv.stride(0), num_tokens, num_q_heads, num_kv_heads, head_dim,
                                cos.data_ptr(), sin.data_ptr(), q.data_ptr(), slot_mapping.data_ptr(),
                                k_cache.data_ptr(), v_cache.data_ptr(), num_slots, torch.get_num_threads())
    if status != 0:
        raise IndexError(f"rotary_qkv: a slot in slot_mapping is past the cache's {num_slots} slots")
    return q
