"""A list of this package's C kernel calls recorded once and replayed in one call (``program.c``).

:class:`Program` records ops: a kernel (the ctypes function of one of the package's libraries) of a known kind and its
arguments, each an int (a pointer or a size, constant for the program's life) or a :class:`Step` value, filled in at
every :meth:`Program.run` from the values given there. What the pointers point at must outlive the program: the
builder keeps the tensors it records (:meth:`Program.keep`). A run can add each op's wall time to a
:class:`KernelTimes`, per kind: where a forward pass's time goes.
"""

import ctypes
from dataclasses import dataclass

from kernels.cpu import native

# program.c's op kinds
ADD_RMS_NORM, GEMM, GEMM_INT8, ROTARY_QKV, ATTENTION, SILU_MUL, LORA_SHRINK, LORA_EXPAND = range(1, 9)
KIND_NAMES = {ADD_RMS_NORM: "add_rms_norm", GEMM: "gemm", GEMM_INT8: "gemm_int8", ROTARY_QKV: "rotary_qkv",
              ATTENTION: "attention", SILU_MUL: "silu_mul", LORA_SHRINK: "lora_shrink", LORA_EXPAND: "lora_expand"}
NUM_KINDS = 9  # program.c's NUM_KINDS: the counters of a KernelTimes, indexed by kind
MAX_ARGS = 16
_ARITY = {ADD_RMS_NORM: 7, GEMM: 8, GEMM_INT8: 10, ROTARY_QKV: 14, ATTENTION: 16, SILU_MUL: 5, LORA_SHRINK: 10,
          LORA_EXPAND: 14}


class ProgramError(RuntimeError):
    """An op of a replay returned a failure status (``index``: which op, ``status``: what it returned)."""

    def __init__(self, index: int, status: int):
        super().__init__(f"op {index} of the program returned {status}")
        self.index, self.status = index, status


@dataclass(frozen=True, slots=True)
class Step:
    """An argument taken from the step's values at each run: ``values[index]``."""

    index: int


class _Op(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("fn", ctypes.c_void_p), ("vars", ctypes.c_int64),
                ("f", ctypes.c_double), ("a", ctypes.c_int64 * MAX_ARGS)]


def _library():
    library = native.load("program")
    if library is not None and not getattr(library, "_typed", False):
        library.program_run.restype = ctypes.c_int64
        library.program_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
        library.program_op_size.restype = library.program_num_kinds.restype = ctypes.c_int64
        library._typed = (library.program_op_size() == ctypes.sizeof(_Op)
                          and library.program_num_kinds() == NUM_KINDS)
    return library if library is not None and library._typed else None


def available() -> bool:
    """Whether the replay library is built (native kernels on and a C compiler)."""
    return _library() is not None


def address(function) -> int:
    """The address of a ctypes library function (what an op calls)."""
    return ctypes.cast(function, ctypes.c_void_p).value


class KernelTimes:
    """Wall seconds spent in each op kind over the runs given it (nanosecond counters the C replay adds to)."""

    def __init__(self):
        self._ns = (ctypes.c_int64 * NUM_KINDS)()

    def seconds(self) -> dict[str, float]:
        """{kind name: seconds} for the kinds that ran."""
        return {name: self._ns[kind] / 1e9 for kind, name in KIND_NAMES.items() if self._ns[kind]}


class Program:
    """Ops recorded with :meth:`add`, replayed by :meth:`run` with ``num_values`` step values."""

    def __init__(self, num_values: int):
        self.num_values = num_values
        self._ops: list[_Op] = []
        self._kept: list = []
        self._array = None

    def __len__(self) -> int:
        return len(self._ops)

    @property
    def kinds(self) -> list[int]:
        """Each recorded op's kind, in order."""
        return [op.kind for op in self._ops]

    def keep(self, *objects) -> None:
        """Hold ``objects`` (the tensors whose pointers an op takes) for as long as the program lives."""
        self._kept.extend(objects)

    def add(self, kind: int, function, args, f: float = 0.0) -> None:
        """Record a call of ``function`` (a ctypes function of kind ``kind``) with ``args``: ints, None (a null
        pointer) or :class:`Step` values; ``f`` is the kind's float argument, if it has one."""
        if len(args) != _ARITY[kind]:
            raise ValueError(f"an op of kind {kind} takes {_ARITY[kind]} arguments, got {len(args)}")
        op = _Op(kind=kind, fn=address(function), f=f)
        for i, arg in enumerate(args):
            if isinstance(arg, Step):
                if not 0 <= arg.index < self.num_values:
                    raise ValueError(f"step value {arg.index} is not one of the program's {self.num_values}")
                op.vars |= 1 << i
                op.a[i] = arg.index
            else:
                op.a[i] = 0 if arg is None else int(arg)
        self._ops.append(op)
        self._array = None

    def run(self, values, times: KernelTimes | None = None) -> None:
        """Replay every op with ``values`` (a ctypes int64 array of ``num_values``), each op's time added to
        ``times`` if given; :class:`ProgramError` from the first op that fails (the ops before it have run)."""
        library = _library()
        if self._array is None:
            self._array = (_Op * len(self._ops))(*self._ops)
        status = ctypes.c_int64(0)
        failed = library.program_run(self._array, len(self._ops), values, ctypes.byref(status),
                                     None if times is None else times._ns)
        if failed >= 0:
            raise ProgramError(failed, status.value)
