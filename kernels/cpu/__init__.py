"""Fast torch implementations of the kernel ops for CPUs (see ``kernels/__init__.py``)."""

from kernels.cpu.lora import lora_expand, lora_shrink  # noqa: F401
