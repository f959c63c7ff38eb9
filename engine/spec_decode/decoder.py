"""``SpecDecoder``: which running sequences draft this step, with what, and what their verification said.

Before each step the engine asks it to propose for the running sequences that decode next (one token left to
compute). A sequence drafts only when exactness is cheap to keep: no repetition penalties and past ``min_tokens``
(those change the distribution token by token; they decode one token a step as before). A constrained sequence's
draft is cut at the first token its grammar refuses (the matcher walks the draft and rolls back), and each of its
rows is masked by the grammar's state after the draft's tokens before it (``verify.mask_drafts``). The draft never
runs past ``max_tokens`` or the context. The step drafts nothing when more sequences run than
``max_batch_size`` (at a large enough batch a CPU step is compute-bound: verifying costs more than it saves;
``bench.spec_decode`` measures where).

Adaptive per sequence: an exponential average of its acceptance; under ``min_acceptance_rate`` it stops drafting for
a back-off that doubles each time (1, 2, 4 ... 64 steps), and tries again after it.

Counters per method: steps drafted, tokens drafted, tokens accepted; ``/stats`` reports them with the acceptance
rate and the mean accepted length (drafted tokens kept per verified sequence-step).
"""

from collections.abc import Hashable

from engine.sequence import Sequence
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.suffix import SuffixProposer, SuffixTrie

_EWMA = 0.5  # weight of the newest verification in a sequence's acceptance average
_MAX_BACKOFF = 64


class SpecState:
    """One sequence's drafting: its own suffix trie (suffix method), acceptance average and back-off."""

    __slots__ = ("trie", "fed", "acceptance", "backoff", "resume_step")

    def __init__(self):
        self.trie: SuffixTrie | None = None
        self.fed = 0  # tokens of the sequence fed to its trie
        self.acceptance = 1.0
        self.backoff = 1
        self.resume_step = 0


def _grammatical(matcher, draft: list[int]) -> list[int]:
    """The longest head of ``draft`` the constraint allows from its state now (left as it was)."""
    kept = 0
    for token in draft:
        if matcher.is_terminated() or not matcher.accept_token(token):
            break
        kept += 1
    matcher.rollback(kept)
    return draft[:kept]


def scope_of(seq: Sequence) -> Hashable:
    """The suffix trees a sequence may draft from: its tenant's (cache salt) for its adapter version."""
    return seq.cache_salt, seq.cache_key


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self.k = config.num_speculative_tokens
        if config.method == "ngram":
            self.ngram = NgramProposer(self.k, config.prompt_lookup_min, config.prompt_lookup_max)
            self.suffix = None
        else:
            self.ngram = None
            self.suffix = SuffixProposer(self.k, max_depth=config.suffix_decoding_max_tree_depth,
                                         min_token_prob=config.suffix_decoding_min_token_prob,
                                         max_spec_factor=config.suffix_decoding_max_spec_factor,
                                         max_tree_nodes=config.suffix_decoding_max_tree_nodes)
        self.num_draft_steps = 0  # sequence-steps that carried a draft
        self.num_drafted = 0
        self.num_accepted = 0
        self.num_skipped_batch = 0  # steps that drafted nothing because the batch was too large

    def eligible(self, seq: Sequence) -> bool:
        params = seq.params
        return not params.needs_penalties and seq.num_output_tokens >= params.min_tokens

    def propose(self, running: list[Sequence], step: int) -> None:
        """Set ``spec_token_ids`` of the running sequences that draft this step (the scheduler may cut them)."""
        for seq in running:
            seq.spec_token_ids = []
        if len(running) > self.config.max_batch_size:
            self.num_skipped_batch += 1
            return
        for seq in running:
            if seq.num_tokens - seq.num_computed_tokens != 1 or not self.eligible(seq):
                continue
            state = seq.spec_state
            if state is None:
                state = seq.spec_state = SpecState()
            if step < state.resume_step:
                continue
            room = self.max_model_len - seq.num_tokens - 1
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
            k = min(self.k, room)
            if k <= 0:
                continue
            draft = self._draft(seq, state, k)
            seq.spec_token_ids = _grammatical(seq.matcher, draft) if seq.matcher is not None and draft else draft

    def _draft(self, seq: Sequence, state: SpecState, k: int) -> list[int]:
        if self.ngram is not None:
            return self.ngram.propose(seq.token_ids, k)
        if state.trie is None:
            state.trie = self.suffix.new_sequence_trie([])
        for token in seq.token_ids[state.fed:]:
            state.trie.append(token)
        state.fed = seq.num_tokens
        return self.suffix.propose(seq.token_ids, state.trie, scope_of(seq), k)

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int, step: int) -> None:
        """A verified draft: ``num_accepted`` of its ``num_drafted`` tokens were kept."""
        self.num_draft_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        state = seq.spec_state
        state.acceptance = (1 - _EWMA) * state.acceptance + _EWMA * (num_accepted / num_drafted)
        if state.acceptance < self.config.min_acceptance_rate:
            state.resume_step = step + state.backoff
            state.backoff = min(2 * state.backoff, _MAX_BACKOFF)
            state.acceptance = self.config.min_acceptance_rate  # judged afresh after the back-off
        elif num_accepted == num_drafted:
            state.backoff = 1

    def finished(self, seq: Sequence) -> None:
        """The sequence is done: its output joins its scope's tree (suffix method)."""
        if self.suffix is not None and seq.finish_reason in ("stop", "length"):
            self.suffix.learn(scope_of(seq), seq.output_token_ids)
        seq.spec_state = None

    def stats(self) -> dict:
        drafted, accepted, steps = self.num_drafted, self.num_accepted, self.num_draft_steps
        out = {"method": self.config.method, "num_speculative_tokens": self.k, "draft_steps": steps,
               "drafted_tokens": drafted, "accepted_tokens": accepted,
               "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
               "mean_accepted_length": round(accepted / steps, 3) if steps else 0.0,
               "steps_skipped_batch": self.num_skipped_batch}
        if self.suffix is not None:
            out["suffix_trees"] = self.suffix.stats()
        return out
