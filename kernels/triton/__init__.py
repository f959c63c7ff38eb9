"""Triton kernels for CUDA, one module per op (``*_op.py``), each with the signature of ``kernels.reference``.

On CPU tensors they run through Triton's interpreter (slow; for tests). Beyond the reference signature, keyword-only
extras for the LoRA layers: ``slot_ranks`` ([slots] int32) so adapters of small rank do not pay for ``max_rank``,
and ``num_slices`` / ``slices`` so a fused projection (q/k/v, gate/up) takes one shrink and one expand launch.
``python -m kernels.triton.aot`` compiles every kernel for a GPU target without needing the GPU.
"""

from kernels.triton.lora_expand_op import lora_expand
from kernels.triton.lora_shrink_op import lora_shrink
from kernels.triton.paged_attention_op import paged_attention
from kernels.triton.write_kv_op import write_kv

__all__ = ["lora_expand", "lora_shrink", "paged_attention", "write_kv"]
