"""What every Triton op shares: a launch description and the choice between the GPU and the interpreter.

A :class:`Launch` is everything one kernel launch needs (kernel, grid, arguments, compile options). The ops build
their launches in one function and run them in another, so that ``kernels.triton.aot`` can compile exactly what
the ops would launch, for a GPU this machine does not have.

Kernels run on CUDA tensors through the JIT and on CPU tensors through Triton's interpreter. ``TRITON_INTERPRET=1``
only acts when a function is decorated, and ``import transformers`` already imports triton (whose standard library,
``tl.max``, ``tl.sum``..., is itself made of ``@triton.jit`` functions), so in a test process that set the variable
too late the interpreter would meet JIT functions it cannot run. :func:`interpreting` swaps in interpreted copies
for the duration of a CPU launch, as the interpreter does for the language builtins; the ops thus work on CPU
whatever was imported first. Kernels call no helper ``@triton.jit`` functions of their own for the same reason.
"""

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

# SMs assumed when the tensors are not on a GPU (the interpreter; compile checks), an H100/H200.
DEFAULT_NUM_SMS = 132


@dataclass(slots=True)
class Launch:
    """One kernel launch: ``kernel[grid](*args, **constexprs, **options)``."""

    kernel: object  # a @triton.jit function
    grid: tuple[int, ...]
    args: tuple  # runtime arguments, in the kernel's order
    constexprs: dict = field(default_factory=dict)  # UPPER-case compile-time arguments
    options: dict = field(default_factory=dict)  # num_warps, num_stages

    def run(self, device: torch.device) -> None:
        if any(n == 0 for n in self.grid):
            return
        if device.type == "cuda":
            self.kernel[self.grid](*self.args, **self.constexprs, **self.options)
            return
        with interpreting():
            _interpreted(self.kernel)[self.grid](*self.args, **self.constexprs, **self.options)


@contextmanager
def interpreting():
    """Run Triton's interpreter even if triton was imported without ``TRITON_INTERPRET=1`` (not thread-safe;
    CPU runs are for tests)."""
    swapped = [(module, name, value) for module in (tl, tl.standard) for name, value in vars(module).items()
               if isinstance(value, JITFunction)]
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read at call time by tl.constexpr_function
    for module, name, value in swapped:
        setattr(module, name, _interpreted(value))
    try:
        yield
    finally:
        for module, name, value in swapped:
            setattr(module, name, value)
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


@cache
def _interpreted(kernel) -> InterpretedFunction:
    return kernel if isinstance(kernel, InterpretedFunction) else InterpretedFunction(kernel.fn)


def jit_function(kernel) -> JITFunction:
    """The compilable form of ``kernel``, also when the interpreter wrapped it at import."""
    return JITFunction(kernel.fn) if isinstance(kernel, InterpretedFunction) else kernel


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a fixed H100/H200 count off the GPU, so plans are reproducible)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact fp32 for fp32 inputs (TF32 would differ from the reference and from the
    interpreter); 16-bit inputs use the tensor cores' native precision, where the setting has no effect."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_index(name: str, tensor: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """An index tensor must have exactly this dtype and shape and be contiguous (kernels read it with unit stride)."""
    if tensor.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {tensor.dtype}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """The one device all ``tensors`` live on; ValueError naming them otherwise."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")
    return next(iter(devices.values()))
