"""``StructuredDecoding``: the engine's side of constrained decoding, one per engine.

- at admission, a constrained sequence gets a matcher of its compiled constraint (:meth:`matcher`); compiled
  grammars are cached per cache salt, so one tenant's compile never warms another's (its time would tell);
- every step, the sampler masks the logits rows of the constrained sequences with one batch-filled bitmask
  (:meth:`mask`); unconstrained rows are not touched, and a step without constrained rows pays nothing;
- after sampling, the output processor advances each matcher on its token (:meth:`advance`).

The grammar library loads on the first constrained request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.structured import DEFAULT_BACKEND, make_backend
from engine.structured.grammar_cache import GrammarCache
from engine.structured.params import StructuredOutputsParams
from engine.structured.tokenizer import GrammarTokenizer

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from engine.structured.backend import GrammarMatcher, StructuredOutputBackend


class StructuredDecoding:
    def __init__(self, tokenizer, *, vocab_size: int, eos_token_ids, backend: str = DEFAULT_BACKEND):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = tuple(sorted(eos_token_ids))
        self.backend_name = backend
        self._backend: StructuredOutputBackend | None = None

    @property
    def backend(self) -> StructuredOutputBackend:
        if self._backend is None:
            tokenizer = GrammarTokenizer.from_hf(self._tokenizer, vocab_size=self._vocab_size,
                                                 eos_token_ids=self._eos_token_ids)
            self._backend = make_backend(tokenizer, self.backend_name, cache=GrammarCache())
        return self._backend

    def matcher(self, params: StructuredOutputsParams, cache_salt: str | None) -> GrammarMatcher:
        """A matcher at the start of ``params``' constraint; GrammarCompileError (a ValueError naming the field)
        for one the library refuses."""
        backend = self.backend
        return backend.new_matcher(backend.compile(params, scope=cache_salt))

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
