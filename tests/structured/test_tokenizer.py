import pytest
import torch

from engine.structured import GrammarTokenizer, StructuredOutputsParams, make_backend
from tests.structured.walk import allowed_ids


def test_smollm2_defaults(smollm2_tokenizer):
    assert smollm2_tokenizer.vocab_size == 49152 and smollm2_tokenizer.eos_token_ids == (2,)
    assert smollm2_tokenizer.special_token_ids == tuple(range(17))  # <|endoftext|>, <|im_start|>, <|im_end|>, ...


def test_fingerprint_follows_vocabulary_and_eos(smollm2_tokenizer):
    hf = smollm2_tokenizer.hf_tokenizer
    assert GrammarTokenizer.from_hf(hf).fingerprint == smollm2_tokenizer.fingerprint
    assert GrammarTokenizer.from_hf(hf, vocab_size=49160).fingerprint != smollm2_tokenizer.fingerprint
    assert GrammarTokenizer.from_hf(hf, eos_token_ids=[2, 0]).fingerprint != smollm2_tokenizer.fingerprint


def test_eos_ids_must_be_in_the_vocabulary(smollm2_tokenizer):
    with pytest.raises(ValueError, match="within the vocabulary"):
        GrammarTokenizer.from_hf(smollm2_tokenizer.hf_tokenizer, eos_token_ids=[49152])


def test_special_tokens_are_never_text_and_eos_only_ends(backend):
    allowed = allowed_ids(_first_mask(backend, StructuredOutputsParams(regex="(.|\n)*")))
    assert not allowed & set(range(17)) - {2} and 2 in allowed


def test_a_padded_vocabulary_never_allows_the_padding(smollm2_tokenizer):
    # the model's lm_head may be wider than the tokenizer (here 100 ids more, ending mid-word)
    padded = GrammarTokenizer.from_hf(smollm2_tokenizer.hf_tokenizer, vocab_size=49152 + 100)
    for name in ("guidance", "xgrammar"):
        backend = make_backend(padded, name)
        mask = _first_mask(backend, StructuredOutputsParams(regex="(.|\n)*"))
        assert mask.shape == (1540,)
        assert max(allowed_ids(mask)) < 49152, name


def _first_mask(backend, params) -> torch.Tensor:
    bitmask = backend.allocate_bitmask(1)
    backend.new_matcher(backend.compile(params)).fill_bitmask(bitmask, 0)
    return bitmask[0]
