"""The step message rank 0 broadcasts to the workers: one int64 tensor per step.

Layout: an 8-entry header ``[op, capacity, num_tokens, num_seqs, table_width, num_logits, flags, 0]`` then, for a
step, ``input_ids``, ``positions``, ``slot_mapping`` (``num_tokens`` each), ``block_tables`` (``num_seqs *
table_width``), ``seq_lens`` (``num_seqs``), ``query_start_loc`` (``num_seqs + 1``), ``logits_indices``
(``num_logits``) and, with flag ``_LORA``, ``token_slots`` (``num_tokens``). Receivers must know a broadcast's size
before it comes, so the tensor has a capacity both sides keep: a step that does not fit is preceded by a
``RESIZE`` header in the old capacity, and the capacity (a power of two) only grows, to the largest step seen.
With flag ``_SLOTS`` the adapter slot writes since the last step follow as one pickled object (rare: a slot
write is an adapter load), applied by each worker to its own slot buffers before the forward pass.
"""

from dataclasses import dataclass

import torch

from engine.batch_metadata import BatchMetadata
from engine.distributed.group import TensorParallelGroup

_HEADER = 8
_INITIAL_CAPACITY = 1024
STEP, RESIZE, STOP = 1, 2, 3
_LORA, _SLOTS = 1, 2


@dataclass(frozen=True, slots=True)
class SlotContents:
    """What ``SlotBuffers.write`` reads of an adapter (whole tensors: each rank keeps its own part)."""

    rank: int
    scaling: float
    lora_a: dict[str, torch.Tensor]  # module -> [num_layers, rank, in_features]
    lora_b: dict[str, torch.Tensor]  # module -> [num_layers, out_features, rank]

    @classmethod
    def of(cls, adapter) -> "SlotContents":
        return cls(adapter.rank, adapter.scaling, adapter.lora_a, adapter.lora_b)


SlotEvent = tuple[int, SlotContents | None]  # (slot, contents written) or (slot, None): cleared


@dataclass(slots=True)
class StepMessage:
    input_ids: torch.Tensor  # [num_tokens] int64
    batch: BatchMetadata
    slot_events: list[SlotEvent]


class StepChannel:
    def __init__(self, group: TensorParallelGroup):
        self.group = group
        self.buffer = torch.zeros(_INITIAL_CAPACITY, dtype=torch.int64)

    # ---- rank 0
    def send(self, input_ids: torch.Tensor, batch: BatchMetadata, slot_events: list[SlotEvent]) -> None:
        parts = [
            input_ids,
            batch.positions,
            batch.slot_mapping,
            batch.block_tables.flatten(),
            batch.seq_lens,
            batch.query_start_loc,
            batch.logits_indices,
        ]
        if batch.token_slots is not None:
            parts.append(batch.token_slots)
        parts = [part.cpu() for part in parts]  # a no-op on CPU
        size = _HEADER + sum(part.numel() for part in parts)
        if size > self.buffer.numel():
            self._send_header(RESIZE, capacity=1 << (size - 1).bit_length())
            self.buffer = torch.zeros(1 << (size - 1).bit_length(), dtype=torch.int64)
        flags = (_LORA if batch.token_slots is not None else 0) | (_SLOTS if slot_events else 0)
        self.buffer[:_HEADER] = torch.tensor(
            [
                STEP,
                self.buffer.numel(),
                input_ids.numel(),
                batch.num_seqs,
                batch.block_tables.shape[1],
                batch.logits_indices.numel(),
                flags,
                0,
            ]
        )
        torch.cat(parts, out=self.buffer[_HEADER:size])
        self.group.broadcast(self.buffer, idle=True)
        if slot_events:
            self.group.broadcast_object(slot_events)

    @torch.inference_mode()  # a buffer resized during a step is an inference tensor: write it in that mode
    def send_stop(self) -> None:
        self._send_header(STOP, capacity=self.buffer.numel())

    def _send_header(self, op: int, capacity: int) -> None:
        self.buffer[:_HEADER] = torch.tensor([op, capacity, 0, 0, 0, 0, 0, 0])
        self.group.broadcast(self.buffer, idle=True)

    # ---- workers
    def receive(self, device: torch.device) -> StepMessage | None:
        """The next step (its tensors on ``device``), or None when rank 0 stops the group."""
        while True:
            self.group.broadcast(self.buffer, idle=True)
            op, capacity, num_tokens, num_seqs, width, num_logits, flags, _ = self.buffer[:_HEADER].tolist()
            if op == STOP:
                return None
            if op == RESIZE:
                self.buffer = torch.zeros(capacity, dtype=torch.int64)
                continue
            sizes = [num_tokens, num_tokens, num_tokens, num_seqs * width, num_seqs, num_seqs + 1, num_logits]
            if flags & _LORA:
                sizes.append(num_tokens)
            parts = list(self.buffer[_HEADER : _HEADER + sum(sizes)].to(device).split(sizes))
            batch = BatchMetadata(
                positions=parts[1],
                slot_mapping=parts[2],
                block_tables=parts[3].view(num_seqs, width).int(),
                seq_lens=parts[4].int(),
                query_start_loc=parts[5].int(),
                logits_indices=parts[6],
                token_slots=parts[7].int() if flags & _LORA else None,
            )
            events = self.group.broadcast_object() if flags & _SLOTS else []
            return StepMessage(parts[0], batch, events)
