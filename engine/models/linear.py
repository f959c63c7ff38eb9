"""The one linear layer every projection of the model goes through (fused or not), with a hook for adapters."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class OutputSlice:
    """One HF projection inside a (possibly fused) weight: ``weight[offset:offset+size]`` is ``{prefix}.{name}``."""

    name: str  # HF projection name: "q_proj", "gate_proj", ...
    offset: int
    size: int


# ``adapter(layer, x, y)`` adds low-rank deltas to ``y`` in place; the multi-LoRA slot cache installs it.
AdapterHook = Callable[["Projection", torch.Tensor, torch.Tensor], None]


class Projection(nn.Module):
    """``y = x @ W.T + b`` where ``W`` stacks the weights of the HF projections named in ``slices``.

    Fusing q/k/v and gate/up into one GEMM each is faster on every backend; ``output_slices`` keeps the HF names
    and sizes so weights load by name and adapters know which columns of ``y`` belong to which projection.
    """

    def __init__(self, prefix: str, in_features: int, slices: Sequence[tuple[str, int]], bias: bool):
        super().__init__()
        offsets, offset = [], 0
        for name, size in slices:
            offsets.append(OutputSlice(name, offset, size))
            offset += size
        self.prefix = prefix  # HF module path of the slices' parent, e.g. "model.layers.3.self_attn"
        self.in_features = in_features
        self.out_features = offset
        self.output_slices: tuple[OutputSlice, ...] = tuple(offsets)
        self.weight = nn.Parameter(torch.empty(offset, in_features), requires_grad=False)  # [out, in]
        self.bias = nn.Parameter(torch.empty(offset), requires_grad=False) if bias else None  # [out]
        self.adapter: AdapterHook | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        y = F.linear(x, self.weight, self.bias)
        if self.adapter is not None:
            self.adapter(self, x, y)
        return y

    def hf_names(self) -> dict[str, tuple[nn.Parameter, int, int]]:
        """HF tensor name -> (parameter, first row, rows) for the loader."""
        names = {}
        for piece in self.output_slices:
            names[f"{self.prefix}.{piece.name}.weight"] = (self.weight, piece.offset, piece.size)
            if self.bias is not None:
                names[f"{self.prefix}.{piece.name}.bias"] = (self.bias, piece.offset, piece.size)
        return names

    def extra_repr(self) -> str:
        pieces = ", ".join(f"{p.name}={p.size}" for p in self.output_slices)
        return f"{self.prefix}: in={self.in_features}, out=[{pieces}], bias={self.bias is not None}"
