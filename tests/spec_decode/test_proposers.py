"""The draft proposers alone: what the n-gram lookup and the suffix tries propose, and their bounds."""

import pytest

from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.suffix import SuffixProposer, SuffixTrie


def test_ngram_copies_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    proposer = NgramProposer(4, prompt_lookup_min=1, prompt_lookup_max=3)
    assert proposer.propose([1, 2, 3, 4, 5, 9, 1, 2, 3]) == [4, 5, 9, 1]
    # two earlier occurrences of the 2-gram [1, 2]: the latest one's continuation
    assert proposer.propose([1, 2, 7, 1, 2, 8, 1, 2]) == [8, 1, 2]
    # the 3-gram [5, 1, 2] wins over the 2-gram [1, 2] (longest first)
    assert proposer.propose([5, 1, 2, 6, 1, 2, 7, 5, 1, 2]) == [6, 1, 2, 7]
    assert proposer.propose([1, 2, 3], k=2) == []  # nothing repeats
    assert proposer.propose([4, 4], k=0) == []


def test_ngram_respects_its_minimum_and_lookback():
    assert NgramProposer(3, prompt_lookup_min=2, prompt_lookup_max=4).propose([1, 9, 8, 1]) == []
    far = [1, 2, 3] + [0] * 50 + [1, 2]
    assert NgramProposer(2, 2, 2).propose(far) == [3, 0]
    assert NgramProposer(2, 2, 2, max_lookback=20).propose(far) == []


def test_ngram_refuses_bad_bounds():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramProposer(3, prompt_lookup_min=3, prompt_lookup_max=2)


def test_a_sequence_trie_drafts_from_its_own_earlier_text_as_it_grows():
    proposer = SuffixProposer(4)
    own = proposer.new_sequence_trie([7, 8, 9, 10, 11, 7, 8])
    assert proposer.propose([7, 8, 9, 10, 11, 7, 8], own, scope="t") == [9, 10, 11, 7]
    own.append(9)
    assert proposer.propose([7, 8, 9, 10, 11, 7, 8, 9], own, scope="t") == [10, 11, 7, 8]


def test_scope_trees_are_learnt_per_scope_and_never_shared():
    proposer = SuffixProposer(4)
    proposer.learn(("salt-a", "adapter-1"), [5, 6, 7, 8, 1, 2])
    assert proposer.propose([3, 5, 6], None, ("salt-a", "adapter-1")) == [7, 8, 1, 2]
    assert proposer.propose([3, 5, 6], None, ("salt-b", "adapter-1")) == []  # another tenant: nothing
    assert proposer.propose([3, 5, 6], None, ("salt-a", "adapter-2")) == []  # another adapter version


def test_the_draft_follows_the_most_frequent_continuation_while_it_is_likely_enough():
    proposer = SuffixProposer(6, min_token_prob=0.4)
    for _ in range(3):
        proposer.learn("s", [1, 2, 3, 4])
    proposer.learn("s", [1, 2, 9, 9])
    assert proposer.propose([0, 1, 2], None, "s") == [3, 4]  # 3 of 4 continue with 3
    proposer.learn("s", [3, 5])
    proposer.learn("s", [3, 6])
    proposer.learn("s", [3, 7])
    # after [1, 2, 3] the longer match (3 x "4") decides, whatever follows a lone 3 elsewhere
    assert proposer.propose([0, 1, 2, 3], None, "s") == [4]
    # a one-token match drafts too (a value copied from the prompt starts with one): the likeliest continuation
    assert proposer.propose([8, 3], None, "s") == [4]


def test_a_draft_is_at_most_max_spec_factor_times_its_match():
    text = list(range(20, 40))
    for factor, match, expected in ((1.0, 3, 3), (0.5, 3, 1), (2.0, 3, 6), (1.0, 8, 8), (0.5, 8, 4), (None, 2, 8)):
        proposer = SuffixProposer(8, max_spec_factor=factor)
        proposer.learn("s", text)
        assert proposer.propose([1, *text[:match]], None, "s") == text[match:match + expected], (factor, match)


def test_a_long_copied_run_drafts_k_tokens_not_what_the_trie_depth_leaves():
    """Copying a paragraph from the prompt: the tail matches the prompt at full depth, and a match that long has
    only one token under it in a trie cut at ``max_depth``; the match is shortened so that k tokens follow."""
    paragraph = list(range(100, 160))
    context = [1, 2, *paragraph, 3, *paragraph[:40]]  # the answer has copied 40 tokens so far
    proposer = SuffixProposer(5)
    own = proposer.new_sequence_trie(context)
    assert own.max_depth == 32
    assert proposer.propose(context, own, "s") == paragraph[40:45]
    proposer.learn("s", paragraph)  # the scope's tree: the same paragraph as an earlier answer
    assert proposer.propose([9, *paragraph[:40]], None, "s") == paragraph[40:45]
    length, _ = own.match(context, room=5)
    assert length == 27


def test_a_short_match_proposes_nothing():
    proposer = SuffixProposer(3, min_match=2)
    proposer.learn("s", [4, 5, 6])
    assert proposer.propose([9, 4], None, "s") == []  # one token matched
    assert proposer.propose([4, 5], None, "s") == [6]


def test_tries_are_bounded_in_depth_and_nodes_and_scopes_leave_least_recently_used_first():
    trie = SuffixTrie(max_depth=4, max_nodes=10_000)
    trie.insert(list(range(100)))
    assert trie.num_nodes == 1 + 100 + 99 + 98 + 97  # suffixes cut at four tokens
    capped = SuffixTrie(max_depth=8, max_nodes=50)
    capped.insert(list(range(1000)))
    assert capped.num_nodes == 50
    proposer = SuffixProposer(2, max_tree_nodes=300, max_nodes_per_tree=200)
    proposer.learn("old", list(range(40)))
    proposer.learn("new", list(range(100, 140)))
    proposer.learn("newer", list(range(200, 240)))
    assert "old" not in proposer.trees and proposer.num_nodes <= 300
    assert proposer.stats()["trees"] == len(proposer.trees)


def test_a_value_copied_from_the_prompt_is_drafted_from_its_first_token():
    """An answer that starts quoting a name from its prompt (``"name": "`` then the name's first token) matches
    the prompt on that one token only, since the quote before it is not in the prompt."""
    prompt = [1, 2, 50, 51, 52, 53, 3, 4]  # ... "Priya Varga" ...
    context = [*prompt, 90, 91, 50]  # the answer so far: `{"name": "` (90, 91) and the name's first token
    proposer = SuffixProposer(3)
    own = proposer.new_sequence_trie(context)
    assert proposer.propose(context, own, "s") == [51, 52, 53]
    assert SuffixProposer(3, min_match=2).propose(context, own, "s") == []
