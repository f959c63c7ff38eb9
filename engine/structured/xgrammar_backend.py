"""The xgrammar backend, the second one: grammars compiled ahead into per-state token masks (slower to compile,
its own batch fill). vLLM's name for it, ``xgrammar``, is ours."""

import re
from collections.abc import Sequence
from json import dumps

import torch
import xgrammar
from llguidance.gbnf_to_lark import is_lark_syntax

from engine.structured.backend import GrammarCompileError, GrammarMatcher, StructuredOutputBackend
from engine.structured.bitmask import allow_only, clear_tail
from engine.structured.grammar_cache import GrammarCache
from engine.structured.params import StructuredOutputsParams
from engine.structured.tokenizer import GrammarTokenizer

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[20:14:59] /project/cpp/regex_converter.cc:83: "


class XGrammarMatcher(GrammarMatcher):
    __slots__ = ("_eos_token_ids", "_matcher", "_tail_bits")

    def __init__(self, matcher: xgrammar.GrammarMatcher, eos_token_ids: tuple[int, ...], tail_bits: int | None):
        self._matcher = matcher
        self._eos_token_ids = eos_token_ids
        self._tail_bits = tail_bits

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        # bitmask: [batch, words] int32
        if self._matcher.is_terminated():  # xgrammar raises for a mask after EOS; llguidance allows EOS only
            allow_only(bitmask, row, self._eos_token_ids)
        else:
            self._matcher.fill_next_token_bitmask(bitmask, row)
            clear_tail(bitmask, [row], self._tail_bits)

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def is_complete(self) -> bool:
        return self._matcher.is_completed()

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        try:
            self._matcher.rollback(num_tokens)
        except RuntimeError as exc:
            raise ValueError(f"cannot roll back {num_tokens} tokens: {_message(exc)}") from None


class XGrammarBackend(StructuredOutputBackend):
    """``num_threads`` for the batch fill: None is xgrammar's default (half the CPUs)."""

    name = "xgrammar"

    def __init__(self, tokenizer: GrammarTokenizer, *, cache: GrammarCache | None = None,
                 num_threads: int | None = None):
        super().__init__(tokenizer, cache=cache)
        # our cache sits in front of the compiler, so xgrammar's own would only hold second copies
        self._compiler = xgrammar.GrammarCompiler(_tokenizer_info(tokenizer), cache_enabled=False)
        self._batch = xgrammar.BatchGrammarMatcher("auto" if num_threads is None else num_threads)
        # xgrammar sets the bits past the vocabulary in a row's last word; ids that do not exist must stay 0
        self._tail_bits = (1 << tokenizer.vocab_size % 32) - 1 if tokenizer.vocab_size % 32 else None

    def fill_bitmask_batch(self, bitmask: torch.Tensor, matcher_rows: Sequence[tuple[GrammarMatcher, int]]) -> None:
        # bitmask: [batch, words] int32
        live = [(matcher, row) for matcher, row in matcher_rows if not matcher.is_terminated()]
        for matcher, row in matcher_rows:
            if matcher.is_terminated():
                matcher.fill_bitmask(bitmask, row)
        if live:
            rows = [row for _, row in live]
            self._batch.batch_fill_next_token_bitmask([m._matcher for m, _ in live], bitmask, rows)
            clear_tail(bitmask, rows, self._tail_bits)

    def _compile(self, params: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        try:
            return self._compile_kind(params)
        except (RuntimeError, ValueError) as exc:
            raise GrammarCompileError(params.kind, _message(exc)) from None

    def _compile_kind(self, params: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        if params.kind in ("json", "json_object"):
            schema = params.schema if params.kind == "json" else {"type": "object"}
            compact = params.disable_any_whitespace  # llguidance's compact separators, so both emit the same text
            return self._compiler.compile_json_schema(schema, any_whitespace=not compact,
                                                      separators=(",", ":") if compact else None)
        if params.kind == "regex":
            return self._compiler.compile_regex(params.regex)
        if params.kind == "choice":
            return self._compiler.compile_grammar(
                "root ::= " + " | ".join(dumps(choice, ensure_ascii=False) for choice in params.choice))
        # llguidance's test of which syntax the text is in, so both backends read a grammar alike
        if is_lark_syntax(params.grammar):
            return self._compiler.compile_lark(params.grammar)
        return self._compiler.compile_grammar(params.grammar)

    def _new_matcher(self, handle: xgrammar.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgrammar.GrammarMatcher(handle), self.tokenizer.eos_token_ids, self._tail_bits)


def _tokenizer_info(tokenizer: GrammarTokenizer) -> xgrammar.TokenizerInfo:
    detected = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer.hf_tokenizer, vocab_size=tokenizer.vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
    # xgrammar reads added special tokens (<|im_start|>, ...) as plain text, so `.*` would allow them; an empty
    # entry is how it marks a token that is never part of a grammar's text
    special = set(tokenizer.special_token_ids)
    encoded_vocab = [""] * tokenizer.vocab_size
    for token, token_id in tokenizer.hf_tokenizer.get_vocab().items():
        if token_id < tokenizer.vocab_size and token_id not in special:
            encoded_vocab[token_id] = token
    return xgrammar.TokenizerInfo.from_vocab_and_metadata(encoded_vocab, detected.dump_metadata())


def _message(exc: Exception) -> str:
    return _LOG_PREFIX.sub("", str(exc)).strip()
