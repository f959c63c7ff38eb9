"""CPU paths of the kernel ops: torch plus small C loops where torch has no fast equivalent."""

from kernels.cpu.attention import paged_attention, write_kv

__all__ = ["paged_attention", "write_kv"]
