"""Triton paged attention against ``kernels.reference.paged_attention`` under the interpreter.

SmolLM2-135M's attention shape (9 query heads over 3 KV heads of 64, block size 16) with tiny counts: contexts up
to 40 tokens cross block boundaries, block ids are scattered, and one batch mixes a decode token, a whole prefill
and a prefill chunk over cached context.
"""

import pytest
import torch

from kernels import reference
from kernels.triton import paged_attention
from kernels.triton.paged_attention_op import CONFIGS, base_config, choose_config, plan

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 16
SCALE = HEAD_DIM**-0.5
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def make_batch(seq_lens: list[int], num_queries: list[int], dtype=torch.float32, seed=0, table_width=0):
    """A paged cache holding ``seq_lens[i]`` tokens of sequence i in scattered blocks, and the queries of the
    last ``num_queries[i]`` positions of each sequence. Block tables have at least ``table_width`` columns."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks nobody owns
    block_ids = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq + [1, table_width]), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = block_ids[used:used + n]
        used += n
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(sum(num_queries), NUM_Q_HEADS, HEAD_DIM, generator=gen).to(dtype)
    query_start_loc = torch.tensor([0, *torch.tensor(num_queries).cumsum(0).tolist()], dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), query_start_loc


def check(batch, out):
    expected = reference.paged_attention(*batch, SCALE)
    torch.testing.assert_close(out, expected, **TOLERANCE[batch[0].dtype])


# decode at 40 (3 blocks, last partly full), a whole 17-token prefill, a 5-token chunk after 28 cached tokens
MIXED = ([40, 17, 33], [1, 17, 5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixed_batch_matches_reference(dtype):
    batch = make_batch(*MIXED, dtype=dtype)
    assert choose_config(batch[0], batch[1], batch[3])["BLOCK_M"] == base_config("prefill", dtype)["BLOCK_M"]
    check(batch, paged_attention(*batch, SCALE))


def test_context_split_matches_reference():
    # 4 splits of a 1-tile context leave some splits empty: the merge must weigh them zero
    batch = make_batch(*MIXED)
    out = torch.full_like(batch[0], float("nan"))
    config = dict(CONFIGS["decode"], NUM_SPLITS=4)
    launches = plan(*batch, SCALE, out, config)
    assert len(launches) == 2  # attention, then the merge of the partials
    for launch in launches:
        launch.run(out.device)
    check(batch, out)


def test_decode_batch_splits_the_context_and_matches_reference():
    # the table's width (room for 256 tokens) is what the split count can see without reading seq_lens
    batch = make_batch([40, 7, 33], [1, 1, 1], seed=1, table_width=16)
    config = choose_config(batch[0], batch[1], batch[3])
    assert config["BLOCK_M"] == CONFIGS["decode"]["BLOCK_M"] and config["NUM_SPLITS"] > 1
    check(batch, paged_attention(*batch, SCALE))


def test_small_tiles_cross_sequences_and_skip_sequences_without_queries():
    # BLOCK_M 16 packs 5 tokens per tile: the 12-token prefill spans 3 tiles; sequence 1 has no query this step
    batch = make_batch([12, 20, 3], [12, 0, 3], seed=2)
    out = torch.full_like(batch[0], float("nan"))
    for launch in plan(*batch, SCALE, out, dict(CONFIGS["decode"], NUM_SPLITS=1)):
        launch.run(out.device)
    check(batch, out)


def test_strided_query_view_of_fused_qkv():
    q, *rest = make_batch(*MIXED, seed=3)
    qkv = torch.randn(q.shape[0], (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM)
    qkv[:, : NUM_Q_HEADS * HEAD_DIM] = q.reshape(q.shape[0], -1)
    q_view = qkv[:, : NUM_Q_HEADS * HEAD_DIM].view(-1, NUM_Q_HEADS, HEAD_DIM)
    assert not q_view.is_contiguous()
    check((q, *rest), paged_attention(q_view, *rest, SCALE))


def test_empty_batch():
    q, k_cache, v_cache, *_ = make_batch([5], [1])
    empty = torch.zeros(0, dtype=torch.int32)
    out = paged_attention(q[:0], k_cache, v_cache, torch.zeros(0, 1, dtype=torch.int32), empty,
                          torch.zeros(1, dtype=torch.int32), SCALE)
    assert out.shape == (0, NUM_Q_HEADS, HEAD_DIM)


def test_bad_inputs_raise_value_error():
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc = make_batch(*MIXED)
    with pytest.raises(ValueError, match="seq_lens must be torch.int32"):
        paged_attention(q, k_cache, v_cache, block_tables, seq_lens.long(), query_start_loc, SCALE)
    with pytest.raises(ValueError, match="query_start_loc must have shape"):
        paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc[:-1], SCALE)
    with pytest.raises(ValueError, match="must share one of"):
        paged_attention(q.half(), k_cache, v_cache, block_tables, seq_lens, query_start_loc, SCALE)
    with pytest.raises(ValueError, match="do not fit"):
        paged_attention(q[:, :8], k_cache, v_cache, block_tables, seq_lens, query_start_loc, SCALE)
