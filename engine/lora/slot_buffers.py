"""The device buffers of the adapter slots: every slot's A and B matrices, scale and rank, laid out for the kernels.

One pair of buffers per group of projections the model fuses (q/k/v, o, gate/up, down: ``groups``), with room for
all seven modules so any adapter fits any slot, zero-padded to ``max_rank``:
  ``group_a[group]``: ``[num_layers, num_slots, len(group) * max_rank, in_features]``, the A matrices stacked on the
  rank axis; ``group_b[group]``: ``[num_layers, num_slots, sum of out_features, max_rank]``, the B matrices stacked
  on the output axis. So ``group_a[group][layer]`` is what ``kernels.lora_shrink(..., num_slices=len(group))`` takes
  and one shrink plus one expand serve a fused projection.
  ``lora_a[module]`` ``[num_layers, num_slots, max_rank, in]`` and ``lora_b[module]`` ``[num_layers, num_slots, out,
  max_rank]`` are views of one module's part.
  ``scales`` ``[num_slots]`` fp32 and ``slot_ranks`` ``[num_slots]`` int32, both 0 for a free slot.
Rows/columns past an adapter's rank, and the modules it does not adapt, are zero, so they add nothing. (in, out)
per module come from the fingerprint; for SmolLM2-135M (hidden 576, intermediate 1536, 9 query and 3 KV heads of
64): q_proj and o_proj (576, 576), k_proj and v_proj (576, 192), gate_proj and up_proj (576, 1536), down_proj
(1536, 576).

A tensor-parallel rank's buffers (``shard``) hold its part, split as its base weights are
(``engine.distributed.sharding.ModelShard.lora_spans``): B's output rows of the column-parallel modules (q/k/v,
gate/up), A's input columns of the row-parallel ones (o, down); :meth:`write` takes the whole adapter and keeps that
part. Rank 0 sets ``journal`` to a list, and every write and clear is appended to it for the workers.
"""

import torch

from engine.lora.fingerprint import TARGET_MODULES, ModelFingerprint
from engine.lora.loader import LoadedAdapter

Group = tuple[str, ...]
# How the Llama family's projections are fused (engine.models.llama): one shrink and one expand per group.
LLAMA_GROUPS: tuple[Group, ...] = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"),
                                   ("down_proj",))


class SlotBuffers:
    def __init__(self, fingerprint: ModelFingerprint, *, num_slots: int, max_rank: int, device, dtype,
                 groups: tuple[Group, ...] = LLAMA_GROUPS, shard=None):
        if sorted(m for group in groups for m in group) != sorted(TARGET_MODULES):
            raise ValueError(f"groups {groups} must hold each of {TARGET_MODULES} once")
        self.max_rank = max_rank
        # module -> (input span, output span) of this rank, None: whole (engine.distributed.sharding.Span)
        self.spans = {m: shard.lora_spans(m) if shard is not None else (None, None) for m in TARGET_MODULES}
        self.journal: list | None = None  # (slot, adapter) written / (slot, None) cleared, for the workers
        layers = (fingerprint.num_hidden_layers, num_slots)
        self.group_a: dict[Group, torch.Tensor] = {}  # group -> [layers, slots, n * max_rank, in]
        self.group_b: dict[Group, torch.Tensor] = {}  # group -> [layers, slots, sum of outs, max_rank]
        self.lora_a: dict[str, torch.Tensor] = {}  # module -> [layers, slots, max_rank, in] (a view)
        self.lora_b: dict[str, torch.Tensor] = {}  # module -> [layers, slots, out, max_rank] (a view)
        for group in map(tuple, groups):
            shapes = [self._shape(fingerprint, m) for m in group]
            if len({in_features for in_features, _ in shapes}) != 1:
                raise ValueError(f"the modules of group {group} do not share their input")
            a = torch.zeros(*layers, len(group) * max_rank, shapes[0][0], device=device, dtype=dtype)
            b = torch.zeros(*layers, sum(out for _, out in shapes), max_rank, device=device, dtype=dtype)
            self.group_a[group], self.group_b[group] = a, b
            offset = 0
            for i, (module, (_, out)) in enumerate(zip(group, shapes, strict=True)):
                self.lora_a[module] = a[:, :, i * max_rank : (i + 1) * max_rank]
                self.lora_b[module] = b[:, :, offset : offset + out]
                offset += out
        self.scales = torch.zeros(num_slots, device=device, dtype=torch.float32)  # [num_slots]
        self.slot_ranks = torch.zeros(num_slots, device=device, dtype=torch.int32)  # [num_slots]

    def _shape(self, fingerprint: ModelFingerprint, module: str) -> tuple[int, int]:
        (in_features, out_features), (in_span, out_span) = fingerprint.module_shape(module), self.spans[module]
        return (in_span[1] if in_span else in_features), (out_span[1] if out_span else out_features)

    def group_weights(self, layer: int, group: Group) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lora_a [num_slots, len(group) * max_rank, in], lora_b [num_slots, sum of outs, max_rank])`` of one
        (fused) projection of one layer."""
        return self.group_a[tuple(group)][layer], self.group_b[tuple(group)][layer]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.group_a.values(), *self.group_b.values()))

    def write(self, slot: int, adapter: LoadedAdapter) -> None:
        """Copy an adapter into ``slot`` (this rank's part of it), zeroing what it does not use."""
        if self.journal is not None:
            self.journal.append((slot, adapter))
        rank = adapter.rank
        for module in TARGET_MODULES:
            a = self.lora_a[module][:, slot]  # [num_layers, max_rank, in]
            b = self.lora_b[module][:, slot]  # [num_layers, out, max_rank]
            if module in adapter.lora_a:
                in_span, out_span = self.spans[module]
                source_a, source_b = adapter.lora_a[module], adapter.lora_b[module]
                if in_span is not None:
                    source_a = source_a.narrow(2, *in_span)
                if out_span is not None:
                    source_b = source_b.narrow(1, *out_span)
                a[:, :rank].copy_(source_a, non_blocking=True)
                b[:, :, :rank].copy_(source_b, non_blocking=True)
                a[:, rank:].zero_()
                b[:, :, rank:].zero_()
            else:
                a.zero_()
                b.zero_()
        self.scales[slot] = adapter.scaling
        self.slot_ranks[slot] = rank

    def clear(self, slot: int) -> None:
        """Make a freed slot inert: stale weights stay in the buffers, but a zero scale and rank add nothing."""
        if self.journal is not None:
            self.journal.append((slot, None))
        self.scales[slot] = 0.0
        self.slot_ranks[slot] = 0
