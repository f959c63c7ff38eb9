"""Triton LoRA shrink and expand against ``kernels.reference`` under the interpreter.

SmolLM2-135M's projection sizes (576 in/out, 1536 for the MLP, 192 for k/v) with ranks 1, 8 and 64, tokens without
an adapter, all tokens on one adapter, mixed ranks in one buffer, and a ``y`` that is a column slice of a fused
qkv output.
"""

import pytest
import torch

from kernels import reference
from kernels.triton import lora_expand, lora_expand_op, lora_shrink, lora_shrink_op

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.float16: dict(rtol=4e-3, atol=2e-2)}


def adapters(in_features: int, out_features: int, ranks: list[int], dtype=torch.float32, seed=0):
    """Stacked ``lora_a [slots, max_rank, in]``, ``lora_b [slots, out, max_rank]``, zero beyond each slot's rank
    (as the slot cache keeps them), and per-slot scales."""
    gen = torch.Generator().manual_seed(seed)
    max_rank = max(ranks)
    lora_a = torch.randn(len(ranks), max_rank, in_features, generator=gen) * in_features**-0.5
    lora_b = torch.randn(len(ranks), out_features, max_rank, generator=gen) * max_rank**-0.5
    for slot, rank in enumerate(ranks):
        lora_a[slot, rank:] = 0
        lora_b[slot, :, rank:] = 0
    scales = torch.tensor([2.0, 0.5, 1.0, 4.0][: len(ranks)])
    return lora_a.to(dtype), lora_b.to(dtype), scales


def run_both(x, y, lora_a, lora_b, slots, scales, **kwargs):
    """(triton h, triton y) and (reference h, reference y) for the same inputs."""
    h = lora_shrink(x, lora_a, slots, **kwargs)
    y_triton = y.clone()
    lora_expand(y_triton, h, lora_b, slots, scales, **kwargs)
    h_ref = reference.lora_shrink(x, lora_a, slots)
    y_ref = y.clone()
    reference.lora_expand(y_ref, h_ref, lora_b, slots, scales)
    return (h, y_triton), (h_ref, y_ref)


CASES = {  # in, out, ranks of the slots, token slots
    "qproj_rank8_one_token_without_adapter": (576, 576, [8, 8, 8], [0, 2, -1, 2, 1, 0, 0]),
    "up_rank64_all_on_one_adapter": (576, 1536, [64, 64, 64], [1, 1, 1, 1, 1]),
    "down_rank1": (1536, 576, [1, 1, 1], [2, -1, 0, 0, 2]),
    "mixed_ranks": (576, 192, [64, 1, 8], [2, 0, 1, -1, 1, 2, 2, 0]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shrink_and_expand_match_reference(case):
    in_features, out_features, ranks, token_slots = CASES[case]
    lora_a, lora_b, scales = adapters(in_features, out_features, ranks)
    slots = torch.tensor(token_slots, dtype=torch.int32)
    x = torch.randn(len(token_slots), in_features)
    y = torch.randn(len(token_slots), out_features)
    (h, y_triton), (h_ref, y_ref) = run_both(x, y, lora_a, lora_b, slots, scales)
    torch.testing.assert_close(h, h_ref, **TOLERANCE[torch.float32])
    torch.testing.assert_close(y_triton, y_ref, **TOLERANCE[torch.float32])
    untouched = slots < 0
    assert torch.equal(y_triton[untouched], y[untouched]) and torch.all(h[untouched] == 0)


def test_slot_ranks_skip_padding_and_agree_with_reference():
    lora_a, lora_b, scales = adapters(576, 576, [64, 1, 8], seed=1)
    slots = torch.tensor([2, 0, 1, -1, 1, 2], dtype=torch.int32)
    x, y = torch.randn(6, 576), torch.randn(6, 576)
    ranks = torch.tensor([64, 1, 8], dtype=torch.int32)
    (h, y_triton), (h_ref, y_ref) = run_both(x, y, lora_a, lora_b, slots, scales, slot_ranks=ranks)
    torch.testing.assert_close(h, h_ref, **TOLERANCE[torch.float32])
    torch.testing.assert_close(y_triton, y_ref, **TOLERANCE[torch.float32])
    # what is beyond a slot's rank is never read: garbage there changes nothing
    lora_a[1, 1:], lora_b[2, :, 8:] = float("nan"), float("nan")
    (h2, y2), _ = run_both(x, y, lora_a, lora_b, slots, scales, slot_ranks=ranks)
    assert torch.equal(h2, h) and torch.equal(y2, y_triton)


def test_fp16():
    lora_a, lora_b, scales = adapters(576, 576, [8, 64, 1], dtype=torch.float16, seed=2)
    slots = torch.tensor([1, 1, 0, -1, 2], dtype=torch.int32)
    x, y = torch.randn(5, 576).half(), torch.randn(5, 576).half()
    (h, y_triton), (h_ref, y_ref) = run_both(x, y, lora_a, lora_b, slots, scales)
    torch.testing.assert_close(h, h_ref, **TOLERANCE[torch.float16])
    torch.testing.assert_close(y_triton, y_ref, **TOLERANCE[torch.float16])


def test_expand_into_a_column_slice_of_fused_qkv():
    lora_a, lora_b, scales = adapters(576, 192, [8, 8, 8], seed=3)
    slots = torch.tensor([0, -1, 2, 2], dtype=torch.int32)
    h = torch.randn(4, 8)
    qkv = torch.randn(4, 960)
    k = qkv[:, 576:768]  # [tokens, 192], row stride 960
    expected = qkv.clone()
    reference.lora_expand(expected[:, 576:768], h, lora_b, slots, scales)
    lora_expand(k, h, lora_b, slots, scales)
    torch.testing.assert_close(qkv, expected, **TOLERANCE[torch.float32])
    assert torch.equal(qkv[:, :576], expected[:, :576]) and torch.equal(qkv[:, 768:], expected[:, 768:])


def test_fused_qkv_in_one_shrink_and_one_expand():
    # q, k, v A matrices stacked on the rank axis, B matrices on the output axis; mixed ranks via slot_ranks
    ranks = [8, 1, 8]
    parts = [adapters(576, out, ranks, seed=10 + i) for i, out in enumerate((576, 192, 192))]
    lora_a = torch.cat([a for a, _, _ in parts], dim=1)  # [slots, 3 * 8, 576]
    lora_b = torch.cat([b for _, b, _ in parts], dim=1)  # [slots, 960, 8]
    scales = parts[0][2]
    slots = torch.tensor([0, 2, -1, 1, 1, 0], dtype=torch.int32)
    x, y = torch.randn(6, 576), torch.randn(6, 960)
    slot_ranks = torch.tensor(ranks, dtype=torch.int32)
    h = lora_shrink(x, lora_a, slots, slot_ranks=slot_ranks, num_slices=3)
    y_triton = y.clone()
    lora_expand(y_triton, h, lora_b, slots, scales, slot_ranks=slot_ranks, slices=(576, 192, 192))
    y_ref = y.clone()
    for i, (start, end) in enumerate([(0, 576), (576, 768), (768, 960)]):
        a, b, _ = parts[i]
        reference.lora_expand(y_ref[:, start:end], reference.lora_shrink(x, a, slots), b, slots, scales)
    torch.testing.assert_close(h, reference.lora_shrink(x, lora_a, slots), **TOLERANCE[torch.float32])
    torch.testing.assert_close(y_triton, y_ref, **TOLERANCE[torch.float32])
    # slot 1 has rank 1 in every slice: what lies past it, slice by slice, is never read
    for i in range(3):
        lora_a[1, i * 8 + 1:(i + 1) * 8] = float("nan")
    lora_b[1, :, 1:] = float("nan")
    h2 = lora_shrink(x, lora_a, slots, slot_ranks=slot_ranks, num_slices=3)
    y2 = y.clone()
    lora_expand(y2, h2, lora_b, slots, scales, slot_ranks=slot_ranks, slices=(576, 192, 192))
    assert torch.equal(h2, h) and torch.equal(y2, y_triton)
    with pytest.raises(ValueError, match="slices"):
        lora_expand(y_triton, h, lora_b, slots, scales, slices=(576, 384 - 8, 8))


def test_shrink_without_k_split_and_prefill_tiles():
    # the configs large batches get: 64-token tiles spanning two adapters' runs, one program per tile
    lora_a, _, _ = adapters(576, 576, [8, 8, 8], seed=4)
    slots = torch.tensor([0] * 30 + [-1] * 3 + [2] * 37, dtype=torch.int32)
    x = torch.randn(70, 576)
    h = torch.full((70, 8), float("nan"))
    config = dict(lora_shrink_op.CONFIGS["prefill"], BLOCK_R=16, SPLIT_K=1)
    for launch in lora_shrink_op.plan(x, lora_a, slots, None, h, config):
        launch.run(x.device)
    torch.testing.assert_close(h, reference.lora_shrink(x, lora_a, slots), **TOLERANCE[torch.float32])


def test_decode_batches_split_k_and_prefill_batches_do_not():
    lora_a = torch.empty(8, 16, 576)
    assert lora_shrink_op.choose_config(torch.empty(64, 576), lora_a)["SPLIT_K"] == 9  # 576 / BLOCK_K
    assert lora_shrink_op.choose_config(torch.empty(16384, 576), lora_a)["SPLIT_K"] == 1
    assert lora_expand_op.choose_config(torch.empty(8192, 576), torch.empty(8, 576, 16))["BLOCK_M"] == 64


def test_empty_batch():
    lora_a, lora_b, scales = adapters(576, 576, [8, 8, 8])
    slots = torch.zeros(0, dtype=torch.int32)
    h = lora_shrink(torch.zeros(0, 576), lora_a, slots)
    assert h.shape == (0, 8) and h.dtype == torch.float32
    lora_expand(torch.zeros(0, 576), h, lora_b, slots, scales)


def test_bad_inputs_raise_value_error():
    lora_a, lora_b, scales = adapters(576, 576, [8, 8, 8])
    x, slots = torch.randn(2, 576), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="token_slots must be torch.int32"):
        lora_shrink(x, lora_a, slots.long())
    with pytest.raises(ValueError, match="x must be"):
        lora_shrink(x[:, :100], lora_a, slots)
    with pytest.raises(ValueError, match="must share one of"):
        lora_shrink(x.half(), lora_a, slots)
    with pytest.raises(ValueError, match="slot_ranks must have shape"):
        lora_shrink(x, lora_a, slots, slot_ranks=torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="scales must be torch.float32"):
        lora_expand(torch.zeros(2, 576), torch.zeros(2, 8), lora_b, slots, scales.double())
    with pytest.raises(ValueError, match="shapes do not fit"):
        lora_expand(torch.zeros(2, 576), torch.zeros(2, 4), lora_b, slots, scales)
