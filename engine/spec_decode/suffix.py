"""``SuffixProposer``: drafts from suffix trees of earlier outputs (SuffixDecoding, Snowflake), scoped per tenant.

Two bounded-depth suffix tries answer each proposal: the sequence's own (its prompt and what it generated so far,
extended a token at a time) and the one of its scope, which holds the outputs of that scope's finished requests.
The scope is the cache salt (the gateway's per-tenant value) with the adapter's content hash, the key prefix
caching uses: one tree per tenant and adapter version, so no tenant's text is ever proposed to another, and an
adapter's habits (a JSON shape, a persona's phrases) are learnt from its own outputs only. The longest suffix of
the context found in a trie is matched, and the draft follows the most frequent continuation while its share
of the counts stays at least ``min_token_prob``; of the two tries the longer match wins. A draft is at most
``max_spec_factor`` times as long as its match when that is set (SuffixDecoding's rule, vLLM's
``suffix_decoding_max_spec_factor``; see ``SpeculativeConfig`` for why it is off by default here).

Memory is bounded: each trie is cut at ``max_depth`` tokens; scope trees are kept least recently used first
within ``max_tree_nodes`` nodes in all (about 120 bytes each), and a tree past ``max_nodes_per_tree`` stops
growing.
"""

from collections import OrderedDict
from collections.abc import Hashable


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """Every suffix of the inserted token sequences, cut at ``max_depth`` tokens, with occurrence counts."""

    def __init__(self, max_depth: int = 32, max_nodes: int = 1 << 20):
        self.max_depth = max_depth
        self.max_nodes = max_nodes
        self.root = _Node()
        self.num_nodes = 1
        self._open: list[_Node] = []  # append(): the nodes of the suffixes still shorter than max_depth

    def insert(self, tokens: list[int]) -> None:
        """Add every suffix of ``tokens`` (a whole sequence: a finished request's output)."""
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start:start + self.max_depth]:
                node = self._child(node, token)
                if node is None:
                    return
                node.count += 1

    def append(self, token: int) -> None:
        """Extend the sequence this trie follows by one token: every suffix ending here is counted."""
        extended = []
        for node in [*self._open, self.root]:
            child = self._child(node, token)
            if child is None:
                break
            child.count += 1
            extended.append(child)
        self._open = extended[-(self.max_depth - 1):] if self.max_depth > 1 else []

    def _child(self, node: _Node, token: int) -> "_Node | None":
        child = node.children.get(token)
        if child is None:
            if self.num_nodes >= self.max_nodes:
                return None
            child = node.children[token] = _Node()
            self.num_nodes += 1
        return child

    def match(self, context: list[int], room: int = 1) -> tuple[int, "_Node | None"]:
        """The longest suffix of ``context`` present with a continuation (its length) and its node, at most
        ``max_depth - room`` tokens long so that up to ``room`` tokens can follow it in the trie; (0, None) if none
        is. In a sequence's own trie the whole tail is always present, continued only where it occurred before."""
        # A match at depth d can only be continued by max_depth - d tokens: a match of the full depth would leave
        # a draft of one token when a long run is being copied, exactly where drafting pays most.
        for length in range(min(len(context), max(1, self.max_depth - room)), 0, -1):
            node = self.root
            for token in context[len(context) - length:]:
                node = node.children.get(token)
                if node is None:
                    break
            else:
                if node.children:
                    return length, node
        return 0, None

    @staticmethod
    def continuation(node: _Node, k: int, min_token_prob: float) -> list[int]:
        out = []
        while len(out) < k and node.children:
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            if child.count < min_token_prob * node.count:
                break
            out.append(token)
            node = child
        return out


class SuffixProposer:
    def __init__(self, num_speculative_tokens: int, *, max_depth: int = 32, min_token_prob: float = 0.1,
                 min_match: int = 1, max_spec_factor: float | None = None, max_tree_nodes: int = 4_000_000,
                 max_nodes_per_tree: int = 500_000):
        self.k = num_speculative_tokens
        self.max_depth = max_depth
        self.min_token_prob = min_token_prob
        # 1: a value an answer copies from its prompt (a name, an email) starts with a one-token match; drafting
        # there took the json-extractor set at one stream from 2.17 to 2.6 tokens a step (replayed greedy outputs)
        self.min_match = min_match
        self.max_spec_factor = max_spec_factor
        self.max_tree_nodes = max_tree_nodes
        self.max_nodes_per_tree = max_nodes_per_tree
        self.trees: OrderedDict[Hashable, SuffixTrie] = OrderedDict()

    # ---- a sequence's own trie
    def new_sequence_trie(self, prompt_token_ids: list[int]) -> SuffixTrie:
        trie = SuffixTrie(self.max_depth, self.max_nodes_per_tree)
        for token in prompt_token_ids:
            trie.append(token)
        return trie

    # ---- the scopes' tries
    def scope_trie(self, scope: Hashable) -> SuffixTrie | None:
        trie = self.trees.get(scope)
        if trie is not None:
            self.trees.move_to_end(scope)
        return trie

    def learn(self, scope: Hashable, output_token_ids: list[int]) -> None:
        """A request of ``scope`` finished with this output: later ones of the scope may draft from it."""
        if not output_token_ids:
            return
        trie = self.trees.get(scope)
        if trie is None:
            trie = self.trees[scope] = SuffixTrie(self.max_depth, self.max_nodes_per_tree)
        self.trees.move_to_end(scope)
        trie.insert(output_token_ids)
        while len(self.trees) > 1 and self.num_nodes > self.max_tree_nodes:
            self.trees.popitem(last=False)

    @property
    def num_nodes(self) -> int:
        return sum(trie.num_nodes for trie in self.trees.values())

    def propose(self, context: list[int], own: SuffixTrie | None, scope: Hashable, k: int | None = None) -> list[int]:
        """Up to ``k`` tokens, and at most ``max_spec_factor`` times the match's length, to follow ``context`` (the
        sequence's tokens), from the longer of the matches in its own trie and in its scope's; [] when neither
        matches ``min_match`` tokens."""
        k = self.k if k is None else k
        best_length, best_node = 0, None
        for trie in (own, self.scope_trie(scope)):
            if trie is None:
                continue
            length, node = trie.match(context, room=k)
            if length > best_length:
                best_length, best_node = length, node
        if best_node is None or best_length < self.min_match or k <= 0:
            return []
        if self.max_spec_factor is not None:
            k = min(k, max(1, int(self.max_spec_factor * best_length)))
        return SuffixTrie.continuation(best_node, k, self.min_token_prob)

    def stats(self) -> dict:
        return {"trees": len(self.trees), "nodes": self.num_nodes, "max_tree_nodes": self.max_tree_nodes}
