"""Triton kernels for CUDA, one module per op, each with the signature of ``kernels.reference``.

On CPU tensors they run through Triton's interpreter (slow; for tests). ``lora_shrink`` and ``lora_expand``
also take an optional keyword ``slot_ranks`` so adapters of small rank do not pay for ``max_rank``.
"""

from kernels.triton.lora_expand_op import lora_expand
from kernels.triton.lora_shrink_op import lora_shrink
from kernels.triton.paged_attention_op import paged_attention
from kernels.triton.write_kv_op import write_kv

__all__ = ["lora_expand", "lora_shrink", "paged_attention", "write_kv"]
