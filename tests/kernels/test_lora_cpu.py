"""kernels.cpu.lora_shrink / lora_expand against the reference, at SmolLM2-135M's projection sizes."""

import pytest
import torch

import kernels
from engine.cpu_info import cpu_info
from kernels import cpu, reference
from kernels.cpu import lora as cpu_lora
from kernels.cpu import native
from tests.kernels.conftest import cpu_paths

# (in_features, out_features) of q/o, k/v, gate/up and down in SmolLM2-135M.
SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576)]
NUM_SLOTS = 5


cpu_path = cpu_paths("lora", autouse=True)  # each test through C and through torch


def make_buffers(in_features, out_features, ranks, max_rank, dtype=torch.float32, seed=0):
    """Slot buffers as the slot cache fills them: slot i holds an adapter of rank ranks[i], zero-padded."""
    g = torch.Generator().manual_seed(seed)
    lora_a = torch.zeros(len(ranks), max_rank, in_features, dtype=dtype)  # [slots, max_rank, in]
    lora_b = torch.zeros(len(ranks), out_features, max_rank, dtype=dtype)  # [slots, out, max_rank]
    for slot, rank in enumerate(ranks):
        lora_a[slot, :rank] = (torch.randn(rank, in_features, generator=g) / in_features**0.5).to(dtype)
        lora_b[slot, :, :rank] = (torch.randn(out_features, rank, generator=g) * 0.1).to(dtype)
    scales = torch.rand(len(ranks), generator=g) * 2 + 0.25  # [slots]
    return lora_a, lora_b, scales


def slots_for(num_tokens, seed, *, order="interleaved"):
    """Random slots with some -1 ("interleaved"), the same sorted ("sorted"), or sorted without -1 ("identity":
    rows are already in slot order, the path without gathers)."""
    g = torch.Generator().manual_seed(seed)
    low = 0 if order == "identity" else -1
    slots = torch.randint(low, NUM_SLOTS, (num_tokens,), generator=g, dtype=torch.int32)
    return slots if order == "interleaved" else slots.sort().values


def check_against_reference(x, lora_a, lora_b, scales, token_slots, y, atol):
    h = cpu.lora_shrink(x, lora_a, token_slots)
    h_ref = reference.lora_shrink(x, lora_a, token_slots)
    assert h.dtype == torch.float32 and h.shape == h_ref.shape
    torch.testing.assert_close(h, h_ref, atol=atol, rtol=atol)
    y_ref = y.clone()
    cpu.lora_expand(y, h_ref, lora_b, token_slots, scales)
    reference.lora_expand(y_ref, h_ref, lora_b, token_slots, scales)
    torch.testing.assert_close(y, y_ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("in_features,out_features", SHAPES)
@pytest.mark.parametrize("max_rank", [1, 8, 16, 64])
@pytest.mark.parametrize("order", ["interleaved", "sorted", "identity"])
def test_matches_reference_at_real_sizes(in_features, out_features, max_rank, order):
    ranks = [max_rank, max(1, max_rank // 2), 1, max_rank, max(1, max_rank // 4)]  # mixed ranks, zero-padded
    lora_a, lora_b, scales = make_buffers(in_features, out_features, ranks, max_rank, seed=max_rank)
    token_slots = slots_for(37, seed=in_features + max_rank, order=order)  # odd count
    x = torch.randn(37, in_features)
    y = torch.randn(37, out_features)
    check_against_reference(x, lora_a, lora_b, scales, token_slots, y, atol=1e-4)


def test_tokens_without_adapter_are_untouched_and_get_zero_rows():
    lora_a, lora_b, scales = make_buffers(576, 192, [8] * NUM_SLOTS, 8)
    token_slots = torch.tensor([-1, 2, -1, -1, 2, 0, -1], dtype=torch.int32)
    x, y = torch.randn(7, 576), torch.randn(7, 192)
    before = y.clone()
    h = cpu.lora_shrink(x, lora_a, token_slots)
    assert not h[token_slots < 0].any() and h[token_slots >= 0].abs().sum() > 0
    cpu.lora_expand(y, h, lora_b, token_slots, scales)
    none = token_slots < 0
    assert torch.equal(y[none], before[none]) and not torch.equal(y[~none], before[~none])
    all_none = torch.full((7,), -1, dtype=torch.int32)
    assert not cpu.lora_shrink(x, lora_a, all_none).any()
    cpu.lora_expand(before, h, lora_b, all_none, scales)
    assert torch.equal(before[none], y[none])


def test_expand_into_a_column_slice_of_a_fused_output():
    """y is q|k|v of a fused projection: the k columns are updated in place, the rest untouched."""
    lora_a, lora_b, scales = make_buffers(576, 192, [16, 4, 16, 1, 8], 16)
    token_slots = slots_for(23, seed=5)
    x = torch.randn(23, 576)
    fused = torch.randn(23, 576 + 192 + 192)
    expected = fused.clone()
    h_all = torch.randn(23, 48)  # a fused shrink's output: this projection's h is a column slice too
    h = h_all[:, 16:32]
    cpu.lora_expand(fused[:, 576:768], h, lora_b, token_slots, scales)
    reference.lora_expand(expected[:, 576:768], h.contiguous(), lora_b, token_slots, scales)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5)
    for sorted_tokens in (slots_for(23, seed=6, order="sorted"), slots_for(23, seed=6, order="identity"),
                          torch.full((23,), 3, dtype=torch.int32)):
        out, out_ref = fused.clone(), fused.clone()
        cpu.lora_expand(out[:, 576:768], cpu.lora_shrink(x, lora_a, sorted_tokens), lora_b, sorted_tokens, scales)
        reference.lora_expand(out_ref[:, 576:768], reference.lora_shrink(x, lora_a, sorted_tokens), lora_b,
                              sorted_tokens, scales)
        torch.testing.assert_close(out, out_ref, atol=1e-4, rtol=1e-4)


def plan_kind(token_slots) -> str:
    plan = cpu_lora._plan(token_slots)
    return "padded" if plan.padded is not None else ("runs" if plan.order is None else "gathered")


@pytest.mark.parametrize("slots,kind", [
    ([2, 2, -1, -1, 0, 0, 0, -1, 4, 4, 2, 2, 2], "padded"),  # few tokens: one bmm over slots 0..4
    ([0, 1, 0, 1, 0, 1, 0, 1, -1, 3, 0, 3], "padded"),
    ([1, 1, 1, 2, 2, 2], "padded"),  # already the padded layout: no gather at all
    ([4] * 300 + [0] * 10, "runs"),  # one big slot and a small one: too much padding
    ([2] * 300 + [-1] * 50 + [0] * 200 + [4] * 100 + [2] * 20, "runs"),  # many tokens, in runs
    ([0, 1] * 300 + [-1, 3] * 20, "gathered"),  # many tokens, interleaved: gathered in slot order
])
def test_each_plan_matches_the_reference(slots, kind):
    lora_a, lora_b, scales = make_buffers(1536, 576, [16, 4, 16, 1, 8], 16)
    token_slots = torch.tensor(slots, dtype=torch.int32)
    assert plan_kind(token_slots) == kind
    x, y = torch.randn(len(slots), 1536), torch.randn(len(slots), 576)
    check_against_reference(x, lora_a, lora_b, scales, token_slots, y, atol=1e-4)


@pytest.mark.parametrize("order", ["interleaved", "sorted", "identity"])
def test_a_fused_projection_through_the_padded_plan(order):
    """gate|up in one shrink and a sliced expand, for a decode-sized batch over all slots."""
    lora_a, lora_b, scales = make_buffers(576, 2 * 1536, [16, 8, 16, 4, 16], 16)
    stacked_a = torch.cat([lora_a, lora_a.flip(0)], dim=1)  # [slots, 2 * max_rank, in]: two parts' A
    token_slots = slots_for(64, seed=11, order=order)
    assert plan_kind(token_slots) == "padded"
    x, y = torch.randn(64, 576), torch.randn(64, 2 * 1536)
    h = cpu.lora_shrink(x, stacked_a, token_slots, num_slices=2)
    h_ref = reference.lora_shrink(x, stacked_a, token_slots, num_slices=2)
    torch.testing.assert_close(h, h_ref, atol=1e-4, rtol=1e-4)
    y_ref = y.clone()
    cpu.lora_expand(y, h_ref, lora_b, token_slots, scales, slices=(1536, 1536))
    reference.lora_expand(y_ref, h_ref, lora_b, token_slots, scales, slices=(1536, 1536))
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)


def test_grouping_is_recomputed_when_token_slots_change_in_place():
    lora_a, lora_b, scales = make_buffers(576, 576, [8] * NUM_SLOTS, 8)
    x = torch.randn(9, 576)
    token_slots = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4], dtype=torch.int32)
    first = cpu.lora_shrink(x, lora_a, token_slots)
    token_slots[:] = torch.tensor([4, 3, 2, 1, 0, -1, 0, 1, 2], dtype=torch.int32)  # same tensor, new values
    torch.testing.assert_close(cpu.lora_shrink(x, lora_a, token_slots), reference.lora_shrink(x, lora_a, token_slots))
    same_values = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4], dtype=torch.int32)
    torch.testing.assert_close(cpu.lora_shrink(x, lora_a, same_values), first)
    empty = torch.zeros(0, dtype=torch.int32)
    assert cpu.lora_shrink(x[:0], lora_a, empty).shape == (0, 8)


@pytest.mark.parametrize("order", ["interleaved", "identity"])
@pytest.mark.parametrize("num_tokens", [19, 700])  # the padded plan; gathered or runs
def test_bf16_matches_reference(order, num_tokens):
    lora_a, lora_b, scales = make_buffers(576, 1536, [16, 8, 1, 16, 4], 16, dtype=torch.bfloat16)
    token_slots = slots_for(num_tokens, seed=7, order=order)
    assert (plan_kind(token_slots) == "padded") == (num_tokens == 19)
    x = torch.randn(num_tokens, 576, dtype=torch.bfloat16)
    y = torch.randn(num_tokens, 1536, dtype=torch.bfloat16)
    check_against_reference(x, lora_a, lora_b, scales, token_slots, y, atol=2e-2)


@pytest.mark.parametrize("in_features,out_features", [(576, 960), (1536, 576), (576, 3072)])
def test_bf16_adapter_deltas_stay_within_the_stated_tolerance(in_features, out_features, cpu_path, monkeypatch):
    """bf16 activations and slot buffers (the engine's bf16 mode) on a decode-sized batch, which the C loop takes:
      * h is fp32 sums of the bf16 products: fp32 math on the same bf16 values within 1e-5 of its largest entry;
      * y gets its delta in fp32 and is rounded once (the torch path rounds the delta first): within two bf16
        roundings (2^-7) of |y| + |delta| of the fp32 sum;
      * the delta against the fp32 adapter as PEFT holds it (before A, B and x were rounded to bf16): within
        1.5% of the delta's largest entry (0.6% measured), the accuracy the PEFT comparisons can expect in bf16.
    """
    a32, b32, scales = make_buffers(in_features, out_features, [16, 8, 16, 4, 16], 16, seed=3)
    token_slots = slots_for(48, seed=4, order="sorted")
    x32 = torch.randn(48, in_features, generator=torch.Generator().manual_seed(1))
    y0 = torch.randn(48, out_features, generator=torch.Generator().manual_seed(2)).bfloat16()
    x, lora_a, lora_b = x32.bfloat16(), a32.bfloat16(), b32.bfloat16()
    if cpu_path == "native":
        monkeypatch.setattr(cpu_lora, "_padded_shrink", _fail("the torch path ran"))
        monkeypatch.setattr(cpu_lora, "_padded_expand", _fail("the torch path ran"))
    h = cpu.lora_shrink(x, lora_a, token_slots)
    h_same = reference.lora_shrink(x.float(), lora_a.float(), token_slots)
    assert (h - h_same).abs().max() <= 1e-5 * h_same.abs().max()
    y = y0.clone()
    cpu.lora_expand(y, h, lora_b, token_slots, scales)
    y_same = y0.float()
    reference.lora_expand(y_same, h_same, lora_b.float(), token_slots, scales)
    magnitude = y0.float().abs() + (y_same - y0.float()).abs()
    assert bool(((y.float() - y_same).abs() <= 2**-7 * magnitude).all())
    delta_fp32 = torch.zeros(48, out_features)
    reference.lora_expand(delta_fp32, reference.lora_shrink(x32, a32, token_slots), b32, token_slots, scales)
    assert ((y.float() - y0.float()) - delta_fp32).abs().max() <= 0.015 * delta_fp32.abs().max()


def _fail(message):
    def fail(*args, **kwargs):
        raise AssertionError(message)

    return fail


def test_public_ops_dispatch_to_the_cpu_path():
    lora_a, lora_b, scales = make_buffers(576, 192, [2] * NUM_SLOTS, 2)
    token_slots = slots_for(11, seed=8)
    x, y = torch.randn(11, 576), torch.randn(11, 192)
    y_ref = y.clone()
    assert kernels.backend_for(x.device) == "cpu"
    h = kernels.lora_shrink(x, lora_a, token_slots)
    kernels.lora_expand(y, h, lora_b, token_slots, scales)
    with kernels.use_backend("reference"):
        kernels.lora_expand(y_ref, kernels.lora_shrink(x, lora_a, token_slots), lora_b, token_slots, scales)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("order", ["interleaved", "identity"])
def test_fused_projection_in_one_shrink_and_a_sliced_expand(order):
    """q|k|v of SmolLM2-135M: A stacked on the rank axis, B on the output axis, mixed ranks; the CPU path, the
    reference with ``slot_ranks`` and three separate projections agree."""
    ranks, max_rank, sizes = [16, 4, 16, 1, 8], 16, (576, 192, 192)
    parts = [make_buffers(576, out, ranks, max_rank, seed=20 + i) for i, out in enumerate(sizes)]
    lora_a = torch.cat([a for a, _, _ in parts], dim=1)  # [slots, 3 * max_rank, 576]
    lora_b = torch.cat([b for _, b, _ in parts], dim=1)  # [slots, 960, max_rank]
    scales = parts[0][2]
    slot_ranks = torch.tensor(ranks, dtype=torch.int32)
    token_slots = slots_for(29, seed=9, order=order)
    x, y = torch.randn(29, 576), torch.randn(29, 960)
    h = cpu.lora_shrink(x, lora_a, token_slots, slot_ranks=slot_ranks, num_slices=3)
    torch.testing.assert_close(h, reference.lora_shrink(x, lora_a, token_slots, slot_ranks=slot_ranks, num_slices=3),
                               atol=1e-4, rtol=1e-4)
    y_cpu, y_ref, y_parts = y.clone(), y.clone(), y.clone()
    cpu.lora_expand(y_cpu, h, lora_b, token_slots, scales, slot_ranks=slot_ranks, slices=sizes)
    reference.lora_expand(y_ref, h, lora_b, token_slots, scales, slot_ranks=slot_ranks, slices=sizes)
    offset = 0
    for a, b, _ in parts:
        part = y_parts[:, offset : offset + b.shape[1]]
        reference.lora_expand(part, reference.lora_shrink(x, a, token_slots), b, token_slots, scales)
        offset += b.shape[1]
    torch.testing.assert_close(y_cpu, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y_ref, y_parts, atol=1e-4, rtol=1e-4)


def test_reference_ignores_what_lies_past_each_slots_rank():
    lora_a, lora_b, scales = make_buffers(576, 192, [8, 2, 8, 8, 8], 8, seed=11)
    slot_ranks = torch.tensor([8, 2, 8, 8, 8], dtype=torch.int32)
    token_slots = torch.tensor([1, 0, 1, -1], dtype=torch.int32)
    x, y = torch.randn(4, 576), torch.randn(4, 192)
    h = reference.lora_shrink(x, lora_a, token_slots, slot_ranks=slot_ranks)
    y_clean = y.clone()
    reference.lora_expand(y_clean, h, lora_b, token_slots, scales, slot_ranks=slot_ranks)
    lora_a[1, 2:], lora_b[1, :, 2:] = float("nan"), float("nan")  # garbage past slot 1's rank 2
    h_dirty = reference.lora_shrink(x, lora_a, token_slots, slot_ranks=slot_ranks)
    y_dirty = y.clone()
    reference.lora_expand(y_dirty, h_dirty, lora_b, token_slots, scales, slot_ranks=slot_ranks)
    assert torch.equal(h_dirty, h) and torch.equal(y_dirty, y_clean)


def test_public_ops_forward_the_fused_extras():
    lora_a, lora_b, scales = make_buffers(576, 384, [4] * NUM_SLOTS, 4)
    token_slots = slots_for(7, seed=12)
    x, y = torch.randn(7, 576), torch.randn(7, 384)
    stacked_a = torch.cat([lora_a, lora_a], dim=1)  # two parts of rank 4
    ranks = torch.full((NUM_SLOTS,), 4, dtype=torch.int32)
    h = kernels.lora_shrink(x, stacked_a, token_slots, slot_ranks=ranks, num_slices=2)
    assert h.shape == (7, 8)
    y_fused, y_ref = y.clone(), y.clone()
    kernels.lora_expand(y_fused, h, lora_b, token_slots, scales, slot_ranks=ranks, slices=(192, 192))
    with kernels.use_backend("reference"):
        kernels.lora_expand(y_ref, h, lora_b, token_slots, scales, slot_ranks=ranks, slices=(192, 192))
    torch.testing.assert_close(y_fused, y_ref, atol=1e-5, rtol=1e-5)


def test_float32_decode_batches_take_the_c_loop(cpu_path, monkeypatch):
    """In float32, with sizes that are multiples of 8, a decode-sized batch never reaches the torch plans."""
    lora_a, lora_b, scales = make_buffers(576, 1536, [16, 8, 16, 4, 16], 16)
    token_slots = slots_for(64, seed=3, order="sorted")
    x, y = torch.randn(64, 576), torch.randn(64, 1536)
    y_ref = y.clone()
    reference.lora_expand(y_ref, reference.lora_shrink(x, lora_a, token_slots), lora_b, token_slots, scales)

    def torch_plan(*args, **kwargs):
        raise AssertionError("the torch path ran")

    monkeypatch.setattr(cpu_lora, "_padded_shrink", torch_plan)
    monkeypatch.setattr(cpu_lora, "_padded_expand", torch_plan)
    if cpu_path == "native":
        cpu.lora_expand(y, cpu.lora_shrink(x, lora_a, token_slots), lora_b, token_slots, scales)
        torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    else:
        with pytest.raises(AssertionError, match="torch path"):
            cpu.lora_shrink(x, lora_a, token_slots)


@pytest.mark.parametrize(("dtype", "native"), [(torch.bfloat16, True), (torch.float32, False)])
def test_large_batches_take_the_c_loop_in_bf16_and_torch_gemms_in_fp32(dtype, native, cpu_path, monkeypatch):
    """Past 512 tokens with an adapter float32 goes to torch's GEMMs over runs; bfloat16 stays on the C loop, which
    beat torch's float32 conversions at every size measured (kernels/cpu/lora.py). With native kernels off the C
    loop is tried and declines."""
    lora_a, lora_b, scales = make_buffers(576, 960, [16, 8, 16, 4, 16], 16, dtype=dtype)
    token_slots = slots_for(1000, seed=5, order="sorted")
    x, y = torch.randn(1000, 576).to(dtype), torch.randn(1000, 960).to(dtype)
    taken = []
    for name in ("_native_shrink", "_native_expand"):
        real = getattr(cpu_lora, name)
        monkeypatch.setattr(cpu_lora, name, lambda *args, real=real: taken.append(real(*args)) or taken[-1])
    y_ref = y.float()
    h = cpu.lora_shrink(x, lora_a, token_slots)
    cpu.lora_expand(y, h, lora_b, token_slots, scales)
    reference.lora_expand(y_ref, reference.lora_shrink(x.float(), lora_a.float(), token_slots), lora_b.float(),
                          token_slots, scales)
    if cpu_path == "native":
        assert len(taken) == (2 if native else 0)
        assert all(result is not None and result is not False for result in taken)
    else:
        assert all(result is None or result is False for result in taken)
    torch.testing.assert_close(y.float(), y_ref, atol=2e-2, rtol=2e-2)


def test_bf16_dot_products_where_the_cpu_has_them(cpu_path):
    """On a CPU with AVX512-BF16 the bf16 build's shrink runs on vdpbf16ps (the bf16 tests above then test it)."""
    library = native.load("lora", ("ACT_BF16",))
    if cpu_path == "torch":  # native kernels off
        assert library is None
        return
    assert library is not None, "the C kernel did not build: a C compiler is part of the CPU setup"
    assert library.lora_bf16_dots() == int("avx512_bf16" in cpu_info().flags)


def test_amx_tiles_where_the_cpu_has_them(cpu_path):
    """On a CPU with AMX-BF16 (and AVX512-BF16) the bf16 build runs slots with many tokens on tiles; the tests below
    then test that path against the reference, elsewhere the vector loops."""
    library = native.load("lora", ("ACT_BF16",))
    if cpu_path == "torch":
        assert library is None
        return
    flags = cpu_info().flags
    assert library.lora_amx() == int({"amx_bf16", "amx_tile", "avx512_bf16"} <= set(flags))


# Runs of one slot around the C loop's thresholds (kernels/cpu/lora.c: the shrink takes tiles from 16 tokens of a
# slot, the expand from 4; units of 64 tokens, tiles of 16), so each path and each partial tile is exercised.
RUN_LENGTHS = [1, 3, 4, 5, 15, 16, 17, 33, 64, 65, 130]


@pytest.mark.parametrize("parts,in_features", [((576, 192, 192), 576), ((1536, 1536), 576), ((576,), 1536),
                                               ((48,), 576)])
@pytest.mark.parametrize("max_rank", [16, 32, 64])
@pytest.mark.parametrize("order", ["identity", "interleaved"])
def test_bf16_runs_of_every_length_match_fp32_math_on_the_same_values(parts, in_features, max_rank, order,
                                                                      cpu_path):
    """bf16 x, A and B, fused parts, every run length: h equals fp32 math on the same bf16 values within 1e-5 of its
    largest entry (bf16 products are exact in fp32, only the order of the sums differs), and y is that fp32 delta
    added to y and rounded once (within one bf16 rounding, 2^-8, of |y|, plus 1e-5 of the largest delta; torch's
    path rounds the delta first: two roundings of |y| + |delta|). Rows in slot order are read in place; interleaved
    ones are gathered."""
    g = torch.Generator().manual_seed(max_rank + in_features)
    num_slots, num_parts = len(RUN_LENGTHS), len(parts)
    ranks = [max_rank if i % 3 else max(1, max_rank // 2) for i in range(num_slots)]
    lora_a = torch.zeros(num_slots, num_parts * max_rank, in_features)
    lora_b = torch.zeros(num_slots, sum(parts), max_rank)
    for slot, rank in enumerate(ranks):
        for part in range(num_parts):
            lora_a[slot, part * max_rank: part * max_rank + rank] = torch.randn(rank, in_features, generator=g) / 24
        lora_b[slot, :, :rank] = torch.randn(sum(parts), rank, generator=g) * 0.1
    lora_a, lora_b = lora_a.bfloat16(), lora_b.bfloat16()
    scales = torch.rand(num_slots, generator=g) + 0.5
    token_slots = torch.cat([torch.full((n,), slot, dtype=torch.int32) for slot, n in enumerate(RUN_LENGTHS)])
    if order == "interleaved":
        token_slots = token_slots[torch.randperm(token_slots.shape[0], generator=g)]
    num_tokens = token_slots.shape[0]
    x = torch.randn(num_tokens, in_features, generator=g).bfloat16()
    y0 = torch.randn(num_tokens, sum(parts), generator=g).bfloat16()
    h = cpu.lora_shrink(x, lora_a, token_slots, num_slices=num_parts)
    h_same = reference.lora_shrink(x.float(), lora_a.float(), token_slots, num_slices=num_parts)
    assert (h - h_same).abs().max() <= 1e-5 * h_same.abs().max()
    y = y0.clone()
    slices = parts if num_parts > 1 else None
    cpu.lora_expand(y, h_same, lora_b, token_slots, scales, slices=slices)
    y_same = y0.float()
    reference.lora_expand(y_same, h_same, lora_b.float(), token_slots, scales, slices=slices)
    delta = y_same - y0.float()
    if cpu_path == "native":
        bound = 2**-8 * y_same.abs() + 1e-5 * delta.abs().max()
    else:
        bound = 2**-7 * (y0.float().abs() + delta.abs())
    assert bool(((y.float() - y_same).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("max_rank", [8, 24, 40])
def test_expand_of_parts_and_ranks_that_are_8_past_a_multiple_of_16(dtype, max_rank, cpu_path):
    """The AVX-512 expand takes 16 outputs and 16 ranks at a time: parts of 24 and 40 outputs end in half a block, and
    ranks 8, 24, 40 in half a chunk. Every run length; y against fp32 math on the same values, rounded once."""
    g = torch.Generator().manual_seed(max_rank)
    parts, num_slots = (24, 40, 8), len(RUN_LENGTHS)
    lora_b = (torch.randn(num_slots, sum(parts), max_rank, generator=g) * 0.1).to(dtype)
    scales = torch.rand(num_slots, generator=g) + 0.5
    token_slots = torch.cat([torch.full((n,), slot, dtype=torch.int32) for slot, n in enumerate(RUN_LENGTHS)])
    num_tokens = token_slots.shape[0]
    h = torch.randn(num_tokens, len(parts) * max_rank, generator=g)
    y0 = torch.randn(num_tokens, sum(parts), generator=g).to(dtype)
    y = y0.clone()
    cpu.lora_expand(y, h, lora_b, token_slots, scales, slices=parts)
    y_same = y0.float().clone()
    reference.lora_expand(y_same, h, lora_b.float(), token_slots, scales, slices=parts)
    delta = y_same - y0.float()
    if dtype == torch.float32:
        assert bool(((y - y_same).abs() <= 1e-5 * delta.abs().max()).all())
    elif cpu_path == "native":
        assert bool(((y.float() - y_same).abs() <= 2**-8 * y_same.abs() + 1e-5 * delta.abs().max()).all())
    else:
        assert bool(((y.float() - y_same).abs() <= 2**-7 * (y0.float().abs() + delta.abs())).all())


def test_shapes_that_do_not_fit_are_refused_before_the_c_loop():
    lora_a, lora_b, scales = make_buffers(576, 192, [16] * NUM_SLOTS, 16)
    token_slots = slots_for(8, seed=1, order="identity")
    with pytest.raises((ValueError, RuntimeError)):
        cpu.lora_shrink(torch.randn(8, 512), lora_a, token_slots)  # in_features 512 != 576
    with pytest.raises((ValueError, RuntimeError)):
        cpu.lora_expand(torch.randn(8, 192), torch.randn(8, 4), lora_b, token_slots, scales)  # h narrower than rank
