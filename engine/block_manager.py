"""``BlockManager``: one pool of KV blocks, per-sequence block tables, refcounts and the prefix cache.

Prefix caching: a full block is identified by a chained hash of (parent block's hash, the sequence's adapter
key, the block's token ids), so a hit on block ``i`` implies the whole prefix matches and two adapters never
share KV. The first block's parent is the sequence's cache salt: requests with different salts (tenants) share
no block at all, so no one can learn from a cache hit what another sent.

Freed blocks keep their hash until the pool reuses them; the free queue is the eviction order:
allocation takes from its front, blocks that hold no cached prefix go back to the front (nothing lost by
reusing them first) and cached blocks to the back (least recently freed are evicted first). A sequence's
blocks are freed tail first, so a shared prompt's first blocks outlive its last ones.
"""

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is registered in the prefix cache
    key: tuple | None = None  # (parent hash or salt, adapter key, token ids): confirms a hash hit exactly


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.num_queried_tokens = 0  # prompt tokens looked up in the prefix cache at admission
        self.num_hit_tokens = 0

    # ---- capacity
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- admission of a sequence without blocks
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of ``seq``; at least one token is always left to compute."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits = []
        for i, block_hash in enumerate(self._hashes(seq, max_blocks)):
            block_id = self.cached.get(block_hash)
            if block_id is None or self.blocks[block_id].key != self._key(seq, i):
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, computed: list[int], num_new_tokens: int) -> bool:
        num_new_blocks = self.blocks_needed(len(computed) * self.block_size + num_new_tokens) - len(computed)
        num_revived = sum(1 for block_id in computed if self.blocks[block_id].ref_count == 0)
        return num_new_blocks + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, computed: list[int], num_new_tokens: int) -> None:
        """Give ``seq`` the cached blocks ``computed`` plus fresh blocks for ``num_new_tokens`` more tokens."""
        assert not seq.block_table, f"{seq} already has blocks"
        for block_id in computed:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
        seq.block_table = list(computed)
        seq.num_hashed_blocks = len(computed)
        num_cached_tokens = len(computed) * self.block_size
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += num_cached_tokens
        self.may_append(seq, num_new_tokens, num_computed_tokens=num_cached_tokens)

    # ---- growth of a sequence that has blocks
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed <= self.num_free_blocks

    def may_append(self, seq: Sequence, num_new_tokens: int, *, num_computed_tokens: int | None = None) -> None:
        """Grow ``seq``'s table to hold its next ``num_new_tokens`` tokens and register blocks they fill.

        Blocks are registered when scheduled, before their KV is written: a sequence that hits one in the same
        step reads it in the same forward pass, after every layer's KV write.
        """
        computed = seq.num_computed_tokens if num_computed_tokens is None else num_computed_tokens
        total = computed + num_new_tokens
        for _ in range(self.blocks_needed(total) - len(seq.block_table)):
            seq.block_table.append(self._pop_free_block())
        if self.enable_prefix_caching:  # blocks of known tokens only: a draft's are verified first
            self._register_full_blocks(seq, min(total, seq.num_tokens) // self.block_size)

    def trim(self, seq: Sequence) -> None:
        """Free the blocks past what ``seq``'s tokens need (those a rejected draft took); they hold no cached
        prefix: only blocks of verified tokens are registered."""
        keep = self.blocks_needed(seq.num_tokens)
        while len(seq.block_table) > keep:
            block = self.blocks[seq.block_table.pop()]
            assert block.hash is None and block.ref_count == 1, f"{block} is shared or cached"
            block.ref_count = 0
            self.free_queue[block.block_id] = None
            self.free_queue.move_to_end(block.block_id, last=False)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (only while no sequence holds a block)."""
        assert self.num_used_blocks == 0, "the prefix cache can only be reset with every block free"
        for block in self.blocks:
            block.hash = block.key = None
        self.cached.clear()

    # ---- stats and checks
    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def check_invariants(self, seqs_with_blocks: Iterable[Sequence]) -> None:
        refs = [0] * len(self.blocks)
        for seq in seqs_with_blocks:
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], f"{block}: {refs[block.block_id]} tables hold it"
            assert (block.ref_count == 0) == (block.block_id in self.free_queue), f"{block} free-queue mismatch"
        for block_hash, block_id in self.cached.items():
            assert self.blocks[block_id].hash == block_hash, f"cache entry {block_hash} -> {block_id} is stale"

    # ---- internals
    def _pop_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict its cached prefix
            del self.cached[block.hash]
            block.hash = block.key = None
        block.ref_count = 1
        return block_id

    def _register_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = self._hashes(seq, num_full_blocks)
        for i in range(seq.num_hashed_blocks, num_full_blocks):
            block = self.blocks[seq.block_table[i]]
            if hashes[i] not in self.cached and block.hash is None:
                self.cached[hashes[i]] = block.block_id
                block.hash, block.key = hashes[i], self._key(seq, i)
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, num_full_blocks)

    def _key(self, seq: Sequence, i: int) -> tuple:
        parent = seq.block_hashes[i - 1] if i else ("salt", seq.cache_salt)
        return parent, seq.cache_key, tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chained hashes of ``seq``'s first ``num_blocks`` full blocks, extended lazily on the sequence."""
        for i in range(len(seq.block_hashes), num_blocks):
            seq.block_hashes.append(hash(self._key(seq, i)))
        return seq.block_hashes[:num_blocks] if len(seq.block_hashes) > num_blocks else seq.block_hashes
