"""The backend interface: compile a constraint once (cached), give each sequence a matcher, fill a batch's mask.

The engine's step uses it as: ``compile`` at admission, ``new_matcher`` per sequence, then every step
``fill_bitmask_batch`` -> ``bitmask.apply_bitmask`` on the logits -> sample -> ``accept_token`` on each
constrained sequence; the request ends when ``is_terminated`` (EOS accepted). ``rollback`` undoes rejected drafts.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from engine.structured.bitmask import allocate_bitmask
from engine.structured.grammar_cache import GrammarCache
from engine.structured.params import StructuredOutputsParams
from engine.structured.tokenizer import GrammarTokenizer

if TYPE_CHECKING:  # pragma: no cover
    import torch


class GrammarCompileError(ValueError):
    """A constraint the backend refuses (bad syntax, unsupported feature); ``param`` names the field."""

    def __init__(self, kind: str, reason: str):
        super().__init__(f"structured_outputs.{kind} does not compile: {reason}")
        self.param = f"structured_outputs.{kind}"
        self.reason = reason


class GrammarCompileTimeout(GrammarCompileError):
    """A compile that did not finish within the engine's bound (``--structured-outputs-compile-timeout``)."""

    def __init__(self, kind: str, timeout_s: float):
        ValueError.__init__(self, f"structured_outputs.{kind} did not compile within {timeout_s:g} s")
        self.param = f"structured_outputs.{kind}"
        self.reason = f"did not compile within {timeout_s:g} s"


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A constraint compiled for one backend and tokenizer; shared by every sequence that uses it."""

    backend: str
    key: str
    kind: str
    handle: object  # the library's compiled form


class GrammarMatcher(ABC):
    """One sequence's position in its grammar."""

    __slots__ = ()

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (bitmask: [batch, words] int32, CPU). Bits past
        the vocabulary are 0; after EOS was accepted only the EOS ids are allowed."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance on the sampled token. False, with the state unchanged, when the grammar does not allow it."""

    @abstractmethod
    def is_complete(self) -> bool:
        """The tokens so far are a whole match of the grammar: EOS is allowed now."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """EOS was accepted: the request is done."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (at most as many as were accepted)."""


class StructuredOutputBackend(ABC):
    """One grammar library bound to one tokenizer, with a cache of compiled grammars."""

    name: ClassVar[str]

    def __init__(self, tokenizer: GrammarTokenizer, *, cache: GrammarCache[CompiledGrammar] | None = None):
        self.tokenizer = tokenizer
        self.cache = GrammarCache() if cache is None else cache

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        """[batch_size, ceil(vocab_size / 32)] int32 on CPU, every token allowed."""
        return allocate_bitmask(batch_size, self.vocab_size)

    def cache_key(self, params: StructuredOutputsParams, scope: str | None = None) -> str:
        """The backend, the tokenizer's fingerprint, the cache scope and the constraint's canonical key, hashed."""
        parts = f"{self.name}\n{self.tokenizer.fingerprint}\n{scope or ''}\n{params.key()}"
        return hashlib.sha256(parts.encode()).hexdigest()

    def compile(self, params: StructuredOutputsParams, *, scope: str | None = None) -> CompiledGrammar:
        """The compiled constraint, from the cache when this backend and tokenizer compiled it before in the same
        ``scope`` (the engine's cache salt: a tenant's compiles never warm another's, whose timing would tell).
        Raises GrammarCompileError for a constraint the library refuses, or one that can match no text at all
        (a regex such as ``x[^\\s\\S]``): such a request could only ever end in EOS or run to max_tokens."""
        key = self.cache_key(params, scope)
        return self.cache.get_or_compile(key, lambda: self._compile_checked(key, params))

    def _compile_checked(self, key: str, params: StructuredOutputsParams) -> CompiledGrammar:
        grammar = CompiledGrammar(self.name, key, params.kind, self._compile(params))
        matcher = self._new_matcher(grammar.handle)
        bitmask = self.allocate_bitmask(1)  # [1, words]
        matcher.fill_bitmask(bitmask, 0)
        for token_id in self.tokenizer.eos_token_ids:  # EOS is allowed where a library gives up; it is no text
            word, bit = divmod(token_id, 32)
            bitmask[0, word] &= ~((1 << bit) if bit < 31 else -(1 << 31))
        if not bool(bitmask.any()) and not matcher.is_complete():
            raise GrammarCompileError(params.kind, "it can match no text at all")
        return grammar

    def new_matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        """A matcher at the start of ``grammar``, for one sequence."""
        if grammar.backend != self.name:
            raise ValueError(f"grammar compiled by {grammar.backend!r}, not by {self.name!r}")
        return self._new_matcher(grammar.handle)

    @abstractmethod
    def fill_bitmask_batch(self, bitmask: torch.Tensor, matcher_rows: Sequence[tuple[GrammarMatcher, int]]) -> None:
        """Fill ``bitmask[row]`` for each (matcher, row) at once, in parallel where the library can.
        bitmask: [batch, words] int32, CPU, contiguous; rows not named keep their contents."""

    @abstractmethod
    def _compile(self, params: StructuredOutputsParams) -> object:
        """The library's compiled form; raises GrammarCompileError."""

    @abstractmethod
    def _new_matcher(self, handle: object) -> GrammarMatcher: ...
