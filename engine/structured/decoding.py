"""``StructuredDecoding``: the engine's side of constrained decoding, one per engine.

- before admission, the server compiles the constraint off the engine loop (:meth:`compile`, through
  ``engine.structured.async_compile``), so at admission a constrained sequence gets a matcher of a cached grammar
  (:meth:`new_matcher`); the offline API compiles at admission. Compiled grammars are cached per cache salt, so
  one tenant's compile never warms another's (its time would tell);
- every step, the sampler masks the logits rows of the constrained sequences with one batch-filled bitmask
  (:meth:`mask`); unconstrained rows are not touched, and a step without constrained rows pays nothing;
- after sampling, the output processor advances each matcher on its token (:meth:`advance`).

The grammar library loads on the first constrained request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.structured import DEFAULT_BACKEND, make_backend
from engine.structured.grammar_cache import GrammarCache
from engine.structured.params import StructuredOutputsParams
from engine.structured.tokenizer import GrammarTokenizer

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from engine.structured.backend import CompiledGrammar, GrammarMatcher, StructuredOutputBackend


@dataclass(frozen=True, slots=True)
class CompileResult:
    grammar: CompiledGrammar
    cached: bool  # it was in the cache already: no compile was paid
    compile_ms: float  # the lookup and, on a miss, the compile


class StructuredDecoding:
    def __init__(self, tokenizer, *, vocab_size: int, eos_token_ids, backend: str = DEFAULT_BACKEND):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = tuple(sorted(eos_token_ids))
        self.backend_name = backend
        self.cache: GrammarCache[CompiledGrammar] = GrammarCache()
        self._backend: StructuredOutputBackend | None = None
        self._backend_lock = threading.Lock()  # the first compile may come from a worker thread and the loop at once

    @property
    def backend(self) -> StructuredOutputBackend:
        """The grammar library bound to the tokenizer, built on first use (a second or so: the library loads and
        reads the vocabulary)."""
        with self._backend_lock:
            if self._backend is None:
                tokenizer = GrammarTokenizer.from_hf(self._tokenizer, vocab_size=self._vocab_size,
                                                     eos_token_ids=self._eos_token_ids)
                self._backend = make_backend(tokenizer, self.backend_name, cache=self.cache)
            return self._backend

    def cache_key(self, params: StructuredOutputsParams, cache_salt: str | None) -> str:
        """The grammar cache's key of ``params`` under ``cache_salt`` (backend, tokenizer, salt, constraint)."""
        return self.backend.cache_key(params, cache_salt)

    def compile(self, params: StructuredOutputsParams, cache_salt: str | None) -> CompileResult:
        """The compiled constraint, cached per salt; GrammarCompileError (a ValueError naming the field) for one
        the library refuses. Safe on any thread: the server calls it off the engine loop."""
        backend = self.backend
        started = time.perf_counter()
        cached = backend.cache_key(params, cache_salt) in self.cache
        grammar = backend.compile(params, scope=cache_salt)
        return CompileResult(grammar, cached, (time.perf_counter() - started) * 1000)

    def new_matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        """A matcher at the start of ``grammar``, for one sequence."""
        return self.backend.new_matcher(grammar)

    def stats(self) -> dict:
        """The backend's name and the grammar cache's counters (``hits``, ``misses``, ``entries``)."""
        return {"backend": self.backend_name, "grammar_cache": self.cache.stats()}

    def mask(self, logits: torch.Tensor, matchers: list[GrammarMatcher | None]) -> None:
        """Mask in place, in each row with a matcher, the tokens its constraint does not allow next."""
        # logits: [num_rows, vocab]
        rows = [i for i, matcher in enumerate(matchers) if matcher is not None]
        if not rows:
            return
        from engine.structured.bitmask import apply_bitmask  # the libraries load with the first constraint

        backend = self.backend
        bitmask = backend.allocate_bitmask(len(matchers))  # [num_rows, words]
        backend.fill_bitmask_batch(bitmask, [(matchers[i], i) for i in rows])
        apply_bitmask(logits, bitmask, rows)

    @staticmethod
    def advance(matcher: GrammarMatcher, token_id: int) -> bool:
        """Advance on the sampled token; True when the constraint is done (its EOS accepted)."""
        if not matcher.accept_token(token_id):
            raise RuntimeError(f"the sampler picked token {token_id}, which the constraint's mask did not allow")
        return matcher.is_terminated()
