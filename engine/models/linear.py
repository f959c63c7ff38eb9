"""The one linear layer every projection of the model goes through (fused or not, the vocabulary's too), LoRA
included, whole or as one tensor-parallel rank's shard."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from engine.batch_metadata import BatchMetadata
from engine.models.gemm import LinearKernel
from engine.models.quant import QuantizedWeight


@dataclass(frozen=True, slots=True)
class OutputSlice:
    """One HF projection inside a (possibly fused) weight: ``weight[offset:offset+size]`` is ``{prefix}.{name}``."""

    name: str  # HF projection name: "q_proj", "gate_proj", ...
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class LoRAWeights:
    """A projection's view of every adapter slot (the slot cache's buffers, rewritten in place as slots change).

    A fused projection's parts are stacked: A on the rank axis (part ``i`` in rows ``i * max_rank`` on), B on the
    output axis in the order of ``Projection.output_slices``.
    """

    lora_a: torch.Tensor  # [num_slots, num_parts * max_rank, in_features]
    lora_b: torch.Tensor  # [num_slots, out_features, max_rank]
    scales: torch.Tensor  # [num_slots] float32, 0 for a free slot
    slot_ranks: torch.Tensor  # [num_slots] int32, 0 for a free slot


@dataclass(frozen=True, slots=True)
class ProjectionShard:
    """One tensor-parallel rank's part of a projection (``engine.distributed.sharding``).

    Column-parallel (``dim`` 0): the rank holds rows ``starts[i]:starts[i] + size`` of each slice's checkpoint
    weight (and bias); its outputs are its columns of ``y``. Row-parallel (``dim`` 1): it holds input columns
    ``starts[0]:starts[0] + in_features`` of the weight and returns a partial ``y`` that ``all_reduce`` sums over the
    ranks; the bias is added once, by the rank with ``keep_bias``. LoRA follows the weight: a column-parallel
    projection's B holds the rank's output rows, a row-parallel one's A its input columns, so the all-reduce sums the
    adapters' partial deltas with the base's.
    """

    dim: int
    starts: tuple[int, ...]
    all_reduce: Callable | None = None  # [T, out] partial sums -> their sum over the ranks
    keep_bias: bool = True


class Projection(nn.Module):
    """``y = x @ W.T + b (+ each token's adapter: scale * B @ A @ x)`` where ``W`` stacks the HF projections in
    ``slices``.

    Fusing q/k/v and gate/up into one GEMM each is faster on every backend; ``output_slices`` keeps the HF names
    and sizes so weights load by name and adapters know which columns of ``y`` belong to which projection. The
    LoRA part runs only when the step has tokens with an adapter (``batch.token_slots``): one shrink and one
    expand through ``kernels`` for the whole fused projection.

    The base GEMM is ``F.linear`` until :meth:`use_kernel` binds the path chosen for this machine
    (``engine.models.gemm_choice``). A quantized projection (:meth:`quantize`) keeps only its
    ``quant.QuantizedWeight`` and always has a kernel. An empty ``prefix`` names the slices alone (``lm_head``).
    With a ``shard``, ``in_features`` and the slices' sizes are this rank's (see :class:`ProjectionShard`).
    """

    def __init__(self, prefix: str, in_features: int, slices: Sequence[tuple[str, int]], bias: bool,
                 weight: nn.Parameter | None = None, *, shard: ProjectionShard | None = None):
        super().__init__()
        offsets, offset = [], 0
        for name, size in slices:
            offsets.append(OutputSlice(name, offset, size))
            offset += size
        self.prefix = prefix  # HF module path of the slices' parent, e.g. "model.layers.3.self_attn"
        self.in_features = in_features
        self.out_features = offset
        self.output_slices: tuple[OutputSlice, ...] = tuple(offsets)
        if weight is None:
            weight = nn.Parameter(torch.empty(offset, in_features), requires_grad=False)
        elif weight.shape != (offset, in_features):
            raise ValueError(f"{prefix}: weight {tuple(weight.shape)} is not [{offset}, {in_features}]")
        self.weight = weight  # [out, in]; given: shared with another module (a tied lm_head's embedding)
        self.shard = shard
        keep_bias = bias and (shard is None or shard.keep_bias)
        self.bias = nn.Parameter(torch.empty(offset), requires_grad=False) if keep_bias else None  # [out]
        self.reduce = shard.all_reduce if shard is not None else None
        self.lora: LoRAWeights | None = None
        self.kernel: LinearKernel | None = None
        self.quantized: QuantizedWeight | None = None

    @property
    def gemm_weight(self):
        """What the GEMM paths pack: the quantized weight if there is one, else the plain one."""
        return self.quantized if self.quantized is not None else self.weight

    def quantize(self, weight: QuantizedWeight) -> None:
        """Hold ``weight`` instead of the float one (let go); a kernel must be bound before the next forward."""
        if weight.shape != (self.out_features, self.in_features):
            raise ValueError(f"{self.prefix}: quantized weight {weight.shape} is not "
                             f"[{self.out_features}, {self.in_features}]")
        self.quantized, self.weight, self.kernel = weight, None, None

    @property
    def module_names(self) -> tuple[str, ...]:
        return tuple(piece.name for piece in self.output_slices)

    def forward(self, x: torch.Tensor, batch: BatchMetadata | None = None) -> torch.Tensor:
        # x: [num_tokens, in] -> [num_tokens, out]
        y = F.linear(x, self.weight, self.bias) if self.kernel is None else self.kernel(x)
        if self.lora is not None and batch is not None and batch.token_slots is not None:
            self._add_lora(x, y, batch.token_slots)
        return y if self.reduce is None else self.reduce(y)

    def _add_lora(self, x: torch.Tensor, y: torch.Tensor, token_slots: torch.Tensor) -> None:
        lora, num_parts = self.lora, len(self.output_slices)
        h = kernels.lora_shrink(x, lora.lora_a, token_slots, slot_ranks=lora.slot_ranks,
                                num_slices=num_parts)  # [num_tokens, num_parts * max_rank] fp32
        slices = tuple(piece.size for piece in self.output_slices) if num_parts > 1 else None
        kernels.lora_expand(y, h, lora.lora_b, token_slots, lora.scales, slot_ranks=lora.slot_ranks, slices=slices)

    def use_kernel(self, kernel: LinearKernel) -> None:
        """Run the base GEMM through ``kernel`` from now on. The plain weight is let go when no band of the kernel
        uses it: a prepacked copy holds the same numbers, and keeping both would double the model's memory."""
        self.kernel = kernel
        if "torch" not in kernel.paths:
            self.weight = None

    def hf_names(self) -> dict[str, tuple[nn.Parameter, int, int]]:
        """HF tensor name -> (parameter, first row, rows) for the loader."""
        names = {}
        for piece in self.output_slices:
            name = f"{self.prefix}.{piece.name}" if self.prefix else piece.name
            names[f"{name}.weight"] = (self.weight, piece.offset, piece.size)
            if self.bias is not None:
                names[f"{name}.bias"] = (self.bias, piece.offset, piece.size)
        return names

    def checkpoint_parts(self) -> dict[str, tuple[int, int, int] | None]:
        """For a shard: HF tensor name -> ``(dim, start, length)`` of the checkpoint tensor this rank keeps, or None
        for a tensor it keeps nothing of (a row-parallel bias on all ranks but one). Empty when unsharded."""
        if self.shard is None:
            return {}
        parts = {}
        for i, piece in enumerate(self.output_slices):
            name = f"{self.prefix}.{piece.name}" if self.prefix else piece.name
            if self.shard.dim == 0:
                parts[f"{name}.weight"] = parts[f"{name}.bias"] = (0, self.shard.starts[i], piece.size)
            else:
                parts[f"{name}.weight"] = (1, self.shard.starts[0], self.in_features)
                if self.bias is None:
                    parts[f"{name}.bias"] = None
        return parts

    def extra_repr(self) -> str:
        pieces = ", ".join(f"{p.name}={p.size}" for p in self.output_slices)
        fmt = "" if self.quantized is None else f", weight={type(self.quantized).__name__}"
        return f"{self.prefix}: in={self.in_features}, out=[{pieces}], bias={self.bias is not None}{fmt}"
