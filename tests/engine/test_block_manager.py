"""Exact bookkeeping of the block pool: ids, refcounts, free-queue order, prefix-cache hits and evictions."""

import pytest

from engine.block_manager import BlockManager
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

BLOCK = 4


def make_seq(tokens, seq_id=0, lora=None) -> Sequence:
    return Sequence(seq_id, f"r{seq_id}", list(tokens), SamplingParams(), lora_request=lora)


def admit(bm: BlockManager, seq: Sequence, num_new: int | None = None) -> list[int]:
    """What the scheduler does for a waiting sequence; returns the prefix-cache hits."""
    computed = bm.get_computed_blocks(seq)
    num_new = seq.num_tokens - len(computed) * BLOCK if num_new is None else num_new
    assert bm.can_allocate(seq, computed, num_new)
    bm.allocate(seq, computed, num_new)
    seq.num_computed_tokens = len(computed) * BLOCK
    return computed


def advance(seq: Sequence, num_new: int) -> None:
    seq.num_computed_tokens += num_new


def free_order(bm: BlockManager) -> list[int]:
    return list(bm.free_queue)


def test_allocation_takes_blocks_from_the_front_in_order():
    bm = BlockManager(8, BLOCK)
    seq = make_seq(range(10))
    assert admit(bm, seq) == []
    assert seq.block_table == [0, 1, 2]
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    assert free_order(bm) == [3, 4, 5, 6, 7]
    assert bm.num_free_blocks == 5 and bm.num_used_blocks == 3


def test_full_blocks_are_registered_and_partial_ones_are_not():
    bm = BlockManager(8, BLOCK)
    seq = make_seq(range(10))
    admit(bm, seq)
    assert bm.num_cached_blocks == 2  # tokens 0..7; block 2 holds 2 of 4 tokens
    assert bm.blocks[0].hash is not None and bm.blocks[1].hash is not None and bm.blocks[2].hash is None


def test_free_returns_cached_blocks_to_the_back_tail_first_and_uncached_to_the_front():
    bm = BlockManager(8, BLOCK)
    seq = make_seq(range(10))
    admit(bm, seq)
    bm.free(seq)
    assert seq.block_table == []
    assert all(block.ref_count == 0 for block in bm.blocks)
    # block 2 (partial, uncached) is reused first; cached 1 then 0 are evicted last, tail of the prompt first
    assert free_order(bm) == [2, 3, 4, 5, 6, 7, 1, 0]
    assert bm.num_cached_blocks == 2  # still hit-able after free


def test_hits_after_free_revive_blocks_and_count_tokens():
    bm = BlockManager(8, BLOCK)
    first = make_seq(range(10), seq_id=0)
    admit(bm, first)
    bm.free(first)
    second = make_seq([*range(8), 99, 98, 97], seq_id=1)  # same two first blocks
    hits = admit(bm, second)
    assert hits == [0, 1]
    assert second.block_table == [0, 1, 2]  # fresh block 2 was the front of the free queue
    assert second.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in (0, 1, 2)] == [1, 1, 1]
    assert free_order(bm) == [3, 4, 5, 6, 7]
    assert (bm.num_queried_tokens, bm.num_hit_tokens) == (10 + 11, 8)


def test_shared_blocks_are_refcounted_and_survive_one_owner():
    bm = BlockManager(8, BLOCK)
    a, b = make_seq([*range(8), 50], seq_id=0), make_seq([*range(8), 60], seq_id=1)
    admit(bm, a)
    assert admit(bm, b) == [0, 1]
    assert [bm.blocks[i].ref_count for i in (0, 1)] == [2, 2]
    assert a.block_table == [0, 1, 2] and b.block_table == [0, 1, 3]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in (0, 1, 2)] == [1, 1, 0]
    assert free_order(bm) == [2, 4, 5, 6, 7]
    bm.check_invariants([b])


def test_at_least_one_token_is_left_to_compute():
    bm = BlockManager(8, BLOCK)
    a = make_seq(range(8), seq_id=0)
    admit(bm, a)
    b = make_seq(range(8), seq_id=1)  # identical, block-aligned prompt: the last block is recomputed
    assert admit(bm, b) == [0]
    assert b.block_table == [0, 2] and b.num_computed_tokens == 4
    assert bm.blocks[2].hash is None  # a duplicate of block 1's content is not registered twice


def test_eviction_drops_the_least_recently_freed_cached_block():
    bm = BlockManager(4, BLOCK)
    a = make_seq(range(8), seq_id=0)  # blocks 0, 1 (both full, cached)
    admit(bm, a)
    bm.free(a)
    assert free_order(bm) == [2, 3, 1, 0]
    b = make_seq(range(100, 113), seq_id=1)  # needs 4 blocks: takes 2, 3, then evicts 1 and 0
    admit(bm, b)
    assert b.block_table == [2, 3, 1, 0]
    assert bm.blocks[1].hash is not None  # now registered for b's third block, not a's second
    c = make_seq(range(9), seq_id=2)
    assert bm.get_computed_blocks(c) == []  # a's prefix is gone
    bm.check_invariants([b])


def test_adapter_key_separates_prefixes():
    class Adapter:
        id, sha256 = 7, "ab" * 32

    bm = BlockManager(8, BLOCK)
    admit(bm, make_seq(range(9), seq_id=0))
    assert bm.get_computed_blocks(make_seq(range(9), seq_id=1, lora=Adapter())) == []
    assert bm.get_computed_blocks(make_seq(range(9), seq_id=2)) == [0, 1]


def test_chained_hash_needs_the_whole_prefix_to_match():
    bm = BlockManager(8, BLOCK)
    admit(bm, make_seq(range(9), seq_id=0))
    other_first_block = make_seq([9, 9, 9, 9, 4, 5, 6, 7, 8], seq_id=1)  # same second block, different first
    assert bm.get_computed_blocks(other_first_block) == []


def test_append_grows_the_table_one_block_at_a_time_and_registers_filled_blocks():
    bm = BlockManager(8, BLOCK)
    seq = make_seq(range(3))
    admit(bm, seq)
    advance(seq, 3)
    assert seq.block_table == [0] and bm.num_cached_blocks == 0
    seq.token_ids.append(3)  # decode: the 4th token fills block 0
    assert bm.can_append(seq, 1)
    bm.may_append(seq, 1)
    advance(seq, 1)
    assert seq.block_table == [0] and bm.num_cached_blocks == 1
    seq.token_ids.append(4)
    bm.may_append(seq, 1)
    assert seq.block_table == [0, 1]


def test_capacity_checks_count_revived_blocks():
    bm = BlockManager(3, BLOCK)
    a = make_seq(range(8), seq_id=0)
    admit(bm, a)
    bm.free(a)  # blocks 0, 1 free but cached
    b = make_seq([*range(8), 1, 2, 3, 4, 5], seq_id=1)  # hits 0, 1 and needs 2 fresh blocks: only 1 left
    computed = bm.get_computed_blocks(b)
    assert computed == [0, 1]
    assert not bm.can_allocate(b, computed, 5)
    assert bm.can_allocate(b, computed, 4)


def test_chunked_allocation_only_covers_the_chunk():
    bm = BlockManager(8, BLOCK)
    seq = make_seq(range(20))
    admit(bm, seq, num_new=6)
    assert seq.block_table == [0, 1]
    assert bm.num_cached_blocks == 1  # only block 0 is full after this chunk
    advance(seq, 6)
    assert bm.can_append(seq, 14)
    bm.may_append(seq, 14)
    assert seq.block_table == [0, 1, 2, 3, 4]
    assert bm.num_cached_blocks == 5


def test_disabled_prefix_caching_never_hits_or_registers():
    bm = BlockManager(8, BLOCK, enable_prefix_caching=False)
    admit(bm, make_seq(range(9), seq_id=0))
    assert bm.num_cached_blocks == 0
    assert bm.get_computed_blocks(make_seq(range(9), seq_id=1)) == []


def test_invariant_check_catches_a_leaked_reference():
    bm = BlockManager(4, BLOCK)
    seq = make_seq(range(5))
    admit(bm, seq)
    bm.blocks[0].ref_count += 1
    with pytest.raises(AssertionError, match="tables hold it"):
        bm.check_invariants([seq])


def test_double_free_is_refused():
    bm = BlockManager(4, BLOCK)
    seq = make_seq(range(5))
    admit(bm, seq)
    table = list(seq.block_table)
    bm.free(seq)
    seq.block_table = table
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free(seq)


def test_a_cache_salt_scopes_prefix_hits_to_requests_with_the_same_salt():
    bm = BlockManager(16, BLOCK)
    tokens = list(range(13))
    acme = Sequence(0, "a", tokens, SamplingParams(), cache_salt="acme")
    assert admit(bm, acme) == []
    assert [bm.blocks[i].key[0] for i in acme.block_table[:1]] == [("salt", "acme")]
    for seq_id, salt in enumerate(["globex", None], start=1):  # another tenant, and an unsalted request
        other = Sequence(seq_id, f"r{seq_id}", tokens, SamplingParams(), cache_salt=salt)
        assert admit(bm, other) == [], salt
        assert set(other.block_table).isdisjoint(acme.block_table)
    again = Sequence(3, "a2", tokens, SamplingParams(), cache_salt="acme")
    assert admit(bm, again) == acme.block_table[:3]  # the same tenant's repeat: the whole cached prefix
    assert bm.num_hit_tokens == 3 * BLOCK and bm.num_queried_tokens == 4 * len(tokens)
