"""A step's flattened batch for calling a model directly, as the model runner would build it."""

import torch

from engine.batch_metadata import BatchMetadata


def step_batch(chunks: list[tuple[list[int], int, list[int]]], block_size: int) -> tuple[torch.Tensor, BatchMetadata]:
    """(token ids [T], metadata) of a step; ``chunks``: (token ids of this step, tokens already in the cache, block
    table) per sequence. Every token samples (``logits_indices`` covers them all)."""
    ids, positions, slots, lens, starts, tables = [], [], [], [], [0], []
    for tokens, done, table in chunks:
        ids += tokens
        positions += range(done, done + len(tokens))
        slots += [table[p // block_size] * block_size + p % block_size for p in range(done, done + len(tokens))]
        lens.append(done + len(tokens))
        starts.append(starts[-1] + len(tokens))
        tables.append(table)
    width = max(map(len, tables))
    return torch.tensor(ids), BatchMetadata(
        positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        logits_indices=torch.arange(len(ids)),
    )
