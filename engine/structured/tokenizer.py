"""``GrammarTokenizer``: what the grammar libraries need to know about the model's tokenizer, and its identity.

Each backend builds its library's tokenizer from this once; the fingerprint keys the compiled-grammar cache, since a
grammar compiled against one vocabulary is meaningless against another.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast


@dataclass(frozen=True, slots=True)
class GrammarTokenizer:
    """A fast HF tokenizer with the model's vocabulary size (the logits' width, which may exceed the tokenizer's:
    the bitmask then covers the padding, never allowed) and the EOS ids that end a request. A constrained
    request may emit EOS exactly when its grammar is complete."""

    hf_tokenizer: PreTrainedTokenizerFast
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str

    @classmethod
    def from_hf(cls, tokenizer: PreTrainedTokenizerFast, *, vocab_size: int | None = None,
                eos_token_ids: tuple[int, ...] | list[int] | None = None) -> GrammarTokenizer:
        """``vocab_size`` defaults to the tokenizer's length, ``eos_token_ids`` to its EOS token."""
        if not hasattr(tokenizer, "backend_tokenizer"):
            raise ValueError(f"structured outputs need a fast (Rust) tokenizer, got {type(tokenizer).__name__}")
        vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        if eos_token_ids is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the tokenizer has no EOS token; pass eos_token_ids")
            eos_token_ids = (tokenizer.eos_token_id,)
        eos_token_ids = tuple(sorted(set(eos_token_ids)))
        if vocab_size < 1 or not eos_token_ids or not all(0 <= t < vocab_size for t in eos_token_ids):
            raise ValueError(f"EOS ids {eos_token_ids} must be non-empty and within the vocabulary ({vocab_size})")
        return cls(tokenizer, vocab_size, eos_token_ids, _fingerprint(tokenizer, vocab_size, eos_token_ids))

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, vocab_size: int | None = None,
                        eos_token_ids: tuple[int, ...] | list[int] | None = None) -> GrammarTokenizer:
        from transformers import AutoTokenizer

        return cls.from_hf(AutoTokenizer.from_pretrained(folder), vocab_size=vocab_size, eos_token_ids=eos_token_ids)

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """Added tokens marked special (chat markers, EOS): never part of a grammar's text."""
        decoder = self.hf_tokenizer.added_tokens_decoder  # {id: AddedToken}
        return tuple(sorted(i for i, token in decoder.items() if token.special and i < self.vocab_size))


def _fingerprint(tokenizer: PreTrainedTokenizerFast, vocab_size: int, eos_token_ids: tuple[int, ...]) -> str:
    # the serialized Rust tokenizer holds the vocabulary, merges, normalizer and added tokens
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    digest.update(f"\n{vocab_size}\n{eos_token_ids}".encode())
    return digest.hexdigest()
