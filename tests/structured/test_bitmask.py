"""Applying a mask is exact (allowed logits untouched, the rest -inf, only in the named rows), and the batch fill
writes what the per-row fill writes."""

import pytest
import torch

from engine.structured import StructuredOutputsParams, allocate_bitmask, apply_bitmask
from engine.structured.bitmask import allow_only, bitmask_width
from tests.structured.walk import allowed_ids, matcher_after

VOCAB = 49152


def random_bitmask(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (batch, bitmask_width(vocab)), dtype=torch.int32, generator=g)


def unpacked(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """[batch, width] bool, True where allowed; the reference the kernel is checked against."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [batch, words, 32]
    return bits.flatten(1)[:, :width].bool()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_keeps_allowed_logits_and_sets_the_rest_to_minus_inf_in_the_named_rows_only(dtype):
    logits = torch.randn(4, VOCAB).to(dtype)  # [batch, vocab]
    before, bitmask, rows = logits.clone(), random_bitmask(4, VOCAB), [0, 2]
    apply_bitmask(logits, bitmask, rows)
    allowed = unpacked(bitmask, VOCAB)
    for row in rows:
        assert torch.equal(logits[row][allowed[row]], before[row][allowed[row]])
        assert torch.isneginf(logits[row][~allowed[row]]).all()
    assert torch.equal(logits[[1, 3]], before[[1, 3]])


def test_apply_masks_logits_wider_than_the_vocabulary():
    vocab, width = 49152 + 100, 49152 + 200  # a vocabulary that ends mid-word, an lm_head padded past the mask
    logits = torch.randn(3, width)
    before, bitmask = logits.clone(), random_bitmask(3, vocab)
    apply_bitmask(logits, bitmask, [1])
    covered = 32 * bitmask_width(vocab)
    assert torch.isneginf(logits[1, covered:]).all()
    allowed = unpacked(bitmask[1:2], covered)[0]
    assert torch.equal(logits[1, :covered][allowed], before[1, :covered][allowed])
    assert torch.equal(logits[[0, 2]], before[[0, 2]])


def test_apply_with_no_rows_changes_nothing():
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    apply_bitmask(logits, torch.zeros(2, bitmask_width(VOCAB), dtype=torch.int32), [])
    assert torch.equal(logits, before)


def test_allocate_and_allow_only_set_exact_bits():
    bitmask = allocate_bitmask(2, VOCAB)
    assert bitmask.shape == (2, 1536) and bitmask.dtype == torch.int32 and (bitmask == -1).all()
    allow_only(bitmask, 1, [2, 31, 63, 49151])  # bit 31 is the sign bit of an int32 word
    assert allowed_ids(bitmask[1]) == {2, 31, 63, 49151} and (bitmask[0] == -1).all()


def test_batch_fill_equals_the_per_row_fill(backend):
    states = [
        (StructuredOutputsParams(json_object=True), '{"a": [1, '),
        (StructuredOutputsParams(regex="[0-9]{2,4}"), "12"),
        (StructuredOutputsParams(choice=["yes", "no"]), ""),
        (StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}}}), '{"n": 1'),
        (StructuredOutputsParams(grammar='start: "a"+ "b"'), "aa"),
    ]
    matchers = [matcher_after(backend, params, text) for params, text in states]
    done = matcher_after(backend, StructuredOutputsParams(choice=["yes", "no"]), "no")
    assert done.accept_token(backend.tokenizer.eos_token_ids[0])
    matchers.append(done)
    rows = [4, 0, 6, 2, 5, 1]  # row 3 belongs to an unconstrained sequence
    batch = backend.allocate_bitmask(7)
    backend.fill_bitmask_batch(batch, list(zip(matchers, rows, strict=True)))
    single = backend.allocate_bitmask(7)
    for matcher, row in zip(matchers, rows, strict=True):
        matcher.fill_bitmask(single, row)
    assert torch.equal(batch, single)
    assert (batch[3] == -1).all() and allowed_ids(batch[1]) == set(backend.tokenizer.eos_token_ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_and_dense_rows_in_one_batch_are_masked_alike(dtype):
    """Rows allowing a few tokens take the sparse path, the others xgrammar's kernel: the result is the same."""
    logits = torch.randn(6, VOCAB + 64).to(dtype)  # [batch, width]: wider than the vocabulary, as a padded lm_head
    bitmask = random_bitmask(6, VOCAB)
    allow_only(bitmask, 1, [0, 31, 32, 5000, VOCAB - 1])  # sparse
    allow_only(bitmask, 4, [])  # nothing allowed at all
    allow_only(bitmask, 5, list(range(0, VOCAB, 97)))  # one bit in many words: dense
    before, rows = logits.clone(), [0, 1, 4, 5]
    apply_bitmask(logits, bitmask, rows)
    allowed = torch.nn.functional.pad(unpacked(bitmask, VOCAB), (0, 64))
    expected = before.masked_fill(~allowed, float("-inf"))
    assert torch.equal(logits[rows], expected[rows]) and torch.equal(logits[[2, 3]], before[[2, 3]])


def test_the_c_pass_and_the_torch_path_mask_alike(monkeypatch):
    """float32 rows go through kernels/cpu/bitmask.c; with it off, the torch path gives the same logits, for
    all-allowed, all-refused and mixed words, a vocabulary ending mid-word and logits wider than the mask."""
    import engine.structured.bitmask as module

    vocab, width = VOCAB + 100, VOCAB + 200
    bitmask = random_bitmask(8, vocab, seed=3)
    bitmask[0] = -1  # every token allowed
    allow_only(bitmask, 1, [])
    allow_only(bitmask, 2, [0, 31, 32, 63, vocab - 1])
    bitmask[3, ::2] = 0  # half the words refused, the others random
    logits = torch.randn(8, width)
    rows = [0, 1, 2, 3, 5, 7]
    native = logits.clone()
    assert module._apply_native(native, bitmask, rows), "the C kernel did not build here"
    monkeypatch.setattr(module, "_apply_native", lambda *args: False)
    fallback = logits.clone()
    apply_bitmask(fallback, bitmask, rows)
    assert torch.equal(native, fallback)
    assert torch.equal(native[[4, 6]], logits[[4, 6]]) and torch.equal(native[0, :32 * 1540], logits[0, :32 * 1540])


def test_the_c_pass_respects_a_row_stride_and_refuses_rows_outside_the_batch():
    import engine.structured.bitmask as module

    wide = torch.randn(3, VOCAB + 7)
    logits = wide[:, :VOCAB]  # rows of unit stride, further apart than their width
    bitmask = random_bitmask(3, VOCAB, seed=4)
    before = wide.clone()
    assert module._apply_native(logits, bitmask, [2])
    allowed = unpacked(bitmask[2:3], VOCAB)[0]
    assert torch.equal(logits[2][allowed], before[2, :VOCAB][allowed]) and torch.isneginf(logits[2][~allowed]).all()
    assert torch.equal(wide[:2], before[:2]) and torch.equal(wide[2, VOCAB:], before[2, VOCAB:])
    with pytest.raises(IndexError):
        module._apply_native(logits, bitmask, [3])
