"""What one forward pass needs to know about the flattened batch, built by the model runner once per step."""

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class BatchMetadata:
    """Per-step tensors shared by every layer (the sequences' tokens are flattened one after another).

    Sequence ``i`` owns tokens ``query_start_loc[i]:query_start_loc[i+1]``, the last tokens of its context of
    ``seq_lens[i]`` tokens. ``logits_indices`` picks the tokens whose next token is sampled this step (the last
    token of each sequence whose context is complete; a chunk in the middle of a prompt samples nothing).
    ``token_slots`` gives each token's adapter slot (-1: the base model), or is None when no token of the step
    uses an adapter, so such steps pay nothing for LoRA.
    """

    positions: torch.Tensor  # [num_tokens] int64
    slot_mapping: torch.Tensor  # [num_tokens] int64, block_id * block_size + offset
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    logits_indices: torch.Tensor  # [num_sampled] int64, rows of the hidden states to project to the vocabulary
    token_slots: torch.Tensor | None = None  # [num_tokens] int32, adapter slot of each token, -1 = none

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]
