"""CPU paths of the kernel ops: torch plus small C loops where torch has no fast equivalent."""

from kernels.cpu.attention import paged_attention, write_kv
from kernels.cpu.lora import lora_expand, lora_shrink

__all__ = ["lora_expand", "lora_shrink", "paged_attention", "write_kv"]
