"""The llguidance backend, the default: near-zero compile, a parallel batch mask fill, and the widest JSON Schema
coverage (JSONSchemaBench). vLLM calls it ``guidance``; so do we."""

from collections.abc import Sequence

import llguidance
import llguidance.hf
import llguidance.numpy  # on a zero-copy view: importing llguidance.torch builds a torch.compile graph (6 s here)
import torch

from engine.structured.backend import GrammarCompileError, GrammarMatcher, StructuredOutputBackend
from engine.structured.grammar_cache import GrammarCache
from engine.structured.params import StructuredOutputsParams
from engine.structured.tokenizer import GrammarTokenizer

# llguidance's own bounds on the work one grammar may cost, stated here rather than left implicit (they are the
# library's 1.9 defaults; its docs give the speeds): a grammar that needs more is refused by name at compile, or
# ends its request with the error at the step that needs more, so no grammar stalls the engine loop.
DEFAULT_LIMITS = {
    "max_grammar_size": 500_000,  # symbols in all productions: a bound on the grammar's size
    "max_items_in_row": 2_000,  # branching of one production row (a huge enum or alternation)
    "initial_lexer_fuel": 1_000_000,  # building the lexer's regexes at compile, ~50k/ms: ~20 ms
    "max_lexer_states": 250_000,  # lexer states built lazily while decoding, ~1-2 kB each: ~250-500 MB
    "step_lexer_fuel": 200_000,  # one mask's lexer work, ~14k/ms: ~15 ms
    "step_max_items": 50_000,  # one mask's Earley items, ~20k/ms: ~2.5 ms
}


class LLGuidanceMatcher(GrammarMatcher):
    __slots__ = ("_eos_after_stop", "_eos_token_ids", "_matcher")

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: frozenset[int]):
        self._matcher = matcher
        self._eos_token_ids = eos_token_ids
        # llguidance stops a grammar that can grow no further before EOS and then refuses to consume EOS itself
        self._eos_after_stop = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        llguidance.numpy.fill_next_token_bitmask(self._matcher, bitmask.numpy(), row)  # bitmask: [batch, words]

    def accept_token(self, token_id: int) -> bool:
        if token_id in self._eos_token_ids and self._matcher.is_stopped() and not self.is_terminated():
            self._eos_after_stop = self._matcher.is_accepting()
            return self._eos_after_stop
        # try_consume leaves a refused token's state as it was; consume_token would put the matcher in error
        return self._matcher.try_consume_tokens([token_id]) == 1

    def is_complete(self) -> bool:
        return self._matcher.is_accepting()

    def is_terminated(self) -> bool:
        return self._eos_after_stop or self._matcher.stop_reason() == "EndOfSentence"

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0 and self._eos_after_stop:
            self._eos_after_stop = False
            num_tokens -= 1
        if num_tokens > 0 and not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._matcher.get_error()}")


class LLGuidanceBackend(StructuredOutputBackend):
    """``num_threads`` for the batch fill: None is llguidance's default (80% of the CPUs, at most 32: one thread
    on a 2-core machine, where two were no faster on the quiet AMD EPYC VM: 3.6-3.9 ms against 3.8-4.2 ms a batch
    fill, replaying 64 of the suite's outputs). ``limits`` override entries of DEFAULT_LIMITS."""

    name = "guidance"

    def __init__(self, tokenizer: GrammarTokenizer, *, cache: GrammarCache | None = None,
                 num_threads: int | None = None, limits: dict[str, int] | None = None):
        super().__init__(tokenizer, cache=cache)
        unknown = set(limits or {}) - set(DEFAULT_LIMITS)
        if unknown:
            raise ValueError(f"unknown llguidance limits {sorted(unknown)}; known: {sorted(DEFAULT_LIMITS)}")
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        # errors name the failing rule, not the parser's state: the request's sender reads them
        self._limits = llguidance.LLParserLimits(**self.limits, verbose_errors=False)
        self._ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer.hf_tokenizer, n_vocab=tokenizer.vocab_size, eos_token=list(tokenizer.eos_token_ids))
        self._executor = llguidance.LLExecutor(num_threads)
        self._eos_token_ids = frozenset(tokenizer.eos_token_ids)

    def fill_bitmask_batch(self, bitmask: torch.Tensor, matcher_rows: Sequence[tuple[GrammarMatcher, int]]) -> None:
        # bitmask: [batch, words] int32
        pairs = [(matcher._matcher, row) for matcher, row in matcher_rows]
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, pairs, bitmask.numpy())

    def _compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        try:
            grammar = _grammar_text(params)
        except ValueError as exc:  # a GBNF grammar that does not convert, a schema that is not an object
            raise GrammarCompileError(params.kind, str(exc)) from None
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0, limits=self._limits)
        if matcher.is_error():
            raise GrammarCompileError(params.kind, matcher.get_error())
        # kept at its start as the template of every sequence's matcher: a copy is ~40x cheaper than a build
        return matcher

    def _new_matcher(self, handle: llguidance.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(handle.deep_copy(), self._eos_token_ids)


def _grammar_text(params: StructuredOutputsParams) -> str:
    whitespace = {"whitespace_flexible": not params.disable_any_whitespace}
    if params.kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema(params.schema, defaults=whitespace)
    if params.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=whitespace)
    if params.kind == "choice":
        return llguidance.grammar_from("choice", list(params.choice))
    return llguidance.grammar_from(params.kind, getattr(params, params.kind))  # "regex" or "grammar"
