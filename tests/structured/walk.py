"""Constrained decoding without a model: random logits stand in for the model, masked as the engine will mask them."""

import torch

from engine.structured import StructuredOutputBackend, StructuredOutputsParams, apply_bitmask
from engine.structured.backend import GrammarMatcher

SHIFTS = torch.arange(32, dtype=torch.int32)  # [32]


def allowed_ids(bitmask_row: torch.Tensor) -> set[int]:
    """The token ids whose bits are set in one row ([words] int32)."""
    bits = (bitmask_row.unsqueeze(-1) >> SHIFTS) & 1  # [words, 32], bit j of word i = token 32 i + j
    return set(bits.flatten().nonzero().flatten().tolist())


def matcher_after(backend: StructuredOutputBackend, params: StructuredOutputsParams, text: str) -> GrammarMatcher:
    """A matcher that has accepted ``text``'s canonical tokens."""
    matcher = backend.new_matcher(backend.compile(params))
    for token_id in backend.tokenizer.hf_tokenizer.encode(text):
        assert matcher.accept_token(token_id), f"{backend.name} refused {text!r} at token {token_id}"
    return matcher


def allowed_after(backend: StructuredOutputBackend, params: StructuredOutputsParams, text: str) -> set[int]:
    bitmask = backend.allocate_bitmask(1)
    matcher_after(backend, params, text).fill_bitmask(bitmask, 0)
    return allowed_ids(bitmask[0])


def random_walk(backend: StructuredOutputBackend, params: StructuredOutputsParams, *, seed: int,
                max_tokens: int = 256) -> list[int]:
    """Greedy over random logits under the mask, until EOS; the token ids before EOS. At every step EOS must be
    allowed exactly when the matcher is complete, and the chosen token accepted."""
    vocab_size, eos_ids = backend.vocab_size, list(backend.tokenizer.eos_token_ids)
    generator = torch.Generator().manual_seed(seed)
    matcher = backend.new_matcher(backend.compile(params))
    bitmask = backend.allocate_bitmask(1)  # [1, words]
    token_ids = []
    for _ in range(max_tokens):
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, vocab_size, generator=generator)  # [1, vocab]
        apply_bitmask(logits, bitmask, [0])
        assert bool(torch.isfinite(logits[0, eos_ids]).any()) == matcher.is_complete()
        token_id = int(logits.argmax())
        assert matcher.accept_token(token_id)
        if matcher.is_terminated():
            assert token_id in eos_ids
            return token_ids
        token_ids.append(token_id)
    raise AssertionError(f"no EOS within {max_tokens} tokens: {backend.tokenizer.hf_tokenizer.decode(token_ids)!r}")


def walk_text(backend: StructuredOutputBackend, params: StructuredOutputsParams, *, seed: int) -> str:
    return backend.tokenizer.hf_tokenizer.decode(random_walk(backend, params, seed=seed))
