"""CPU paged attention and KV write against the plain-torch references, on both CPU paths."""

import pytest
import torch

import kernels
import kernels.reference as reference
from engine.cpu_info import cpu_info
from kernels import kv_int8
from kernels.cpu import attention, native
from tests.kernels.conftest import cpu_paths


def paged_case(seq_lens, query_lens, *, num_q_heads, num_kv_heads, head_dim, block_size, seed=0, dtype=None,
               kv_dtype=None):
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    kv_dtype = kv_dtype or dtype
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(kv_dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(kv_dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, out-of-order blocks
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    for i, count in enumerate(blocks_per_seq):
        tables[i, :count] = torch.tensor(order[:count])
        order = order[count:]
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(starts[-1]), num_q_heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(seq_lens, dtype=torch.int32), starts, head_dim**-0.5


cpu_path = cpu_paths("paged_attention")  # each test through C and through torch


CASES = {
    # decode of many sequences (the hot path: all kv heads of a sequence in one work item)
    "decode-smollm2-heads": dict(seq_lens=[1, 17, 160, 33, 64, 5, 200, 16, 15, 99], query_lens=[1] * 10,
                                 num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16),
    # all kv heads an item with blocks of 4: a step of 32 keys copies runs of several blocks, odd lengths end a step
    "decode-heads-small-blocks": dict(seq_lens=[1, 2, 33, 70, 31, 96, 45, 129, 3], query_lens=[1] * 9,
                                      num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=4),
    # all kv heads an item spanning 8 x 128 elements: steps of 8 keys (the stack copy holds no more)
    "decode-wide-span": dict(seq_lens=[50, 9, 17, 130, 8, 64, 1, 33], query_lens=[1] * 8, num_q_heads=16,
                             num_kv_heads=8, head_dim=128, block_size=16),
    # few sequences: one kv head per work item; head_dim 128, MHA
    "decode-few-128": dict(seq_lens=[40, 3], query_lens=[1, 1], num_q_heads=4, num_kv_heads=4, head_dim=128,
                           block_size=8),
    # chunked prefill mixed with decodes, block boundaries crossed, query tiles of several sizes
    "mixed": dict(seq_lens=[37, 16, 90, 12, 64], query_lens=[5, 16, 40, 1, 2], num_q_heads=8, num_kv_heads=2,
                  head_dim=32, block_size=16),
    # a whole prompt at once, odd lengths, block size 1 and a generic head_dim
    "prefill-block1": dict(seq_lens=[7, 13], query_lens=[7, 13], num_q_heads=6, num_kv_heads=3, head_dim=48,
                           block_size=1),
    # head_dim not a multiple of 8: the C loop refuses it and the torch path answers
    "odd-head-dim": dict(seq_lens=[9, 30], query_lens=[1, 3], num_q_heads=2, num_kv_heads=1, head_dim=20,
                         block_size=4),
    # blocks larger than the bf16 dot-product path's stack copy (it walks them in steps of 32 keys)
    "decode-big-blocks": dict(seq_lens=[300, 1, 129, 64, 31, 256, 200, 7], query_lens=[1, 1, 3, 1, 1, 1, 1, 1],
                              num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=128),
    # prefill on AMX tiles (bf16, CPUs with amx_bf16): chunks after a cached prefix, more queries than one item's
    # 64 rows, a tile's last keys partly past the context, and a sequence at the 8-query threshold beside a decode
    "prefill-amx-prefix": dict(seq_lens=[300, 45, 70, 9, 33], query_lens=[100, 45, 8, 7, 1], num_q_heads=9,
                               num_kv_heads=3, head_dim=64, block_size=16),
    # AMX: group 8 (8 queries an item), head_dim 128, blocks larger than a step of 32 keys
    "prefill-amx-128": dict(seq_lens=[50, 129], query_lens=[50, 33], num_q_heads=16, num_kv_heads=2, head_dim=128,
                            block_size=64),
    # AMX: multi-head (group 1), head_dim 32, every key in its own block
    "prefill-amx-mha": dict(seq_lens=[70, 17], query_lens=[70, 16], num_q_heads=2, num_kv_heads=2, head_dim=32,
                            block_size=1),
    # a sequence with no queries this step
    "idle-seq": dict(seq_lens=[10, 20], query_lens=[0, 2], num_q_heads=4, num_kv_heads=2, head_dim=16,
                     block_size=4),
}


@pytest.mark.parametrize("case", CASES)
def test_paged_attention_matches_reference(case, cpu_path):
    args = paged_case(**CASES[case])
    expected = reference.paged_attention(*args)
    with kernels.use_backend("cpu"):
        got = kernels.paged_attention(*args)
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


def test_long_context_decode_matches_reference():
    args = paged_case([2000, 1500], [1, 4], num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16, seed=3)
    torch.testing.assert_close(attention.paged_attention(*args), reference.paged_attention(*args),
                               rtol=2e-5, atol=2e-5)


def test_long_prefill_in_one_chunk_matches_reference():
    args = paged_case([300, 45], [300, 45], num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16, seed=4)
    torch.testing.assert_close(attention.paged_attention(*args), reference.paged_attention(*args),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("q_dtype", "kv_dtype"), [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                                                   (torch.bfloat16, torch.float32)])
def test_bfloat16_matches_reference(case, q_dtype, kv_dtype, cpu_path, monkeypatch):
    """The engine's bf16 mode, and a KV cache of another dtype than the model's. The C loop widens bf16 exactly and
    sums in fp32, so it is within one bf16 rounding of the output (2^-8 relative) of the fp32 reference on the
    same values (1e-3 absolute near zero); torch's SDPA in bf16 rounds intermediate products too (2e-2)."""
    args = paged_case(**CASES[case], dtype=q_dtype, kv_dtype=kv_dtype)
    in_c = cpu_path == "native" and CASES[case]["head_dim"] % 8 == 0  # the C loop takes multiples of 8
    if in_c:
        monkeypatch.setattr(attention, "_attend_all_sdpa", _fail("the SDPA path ran"))
    got = attention.paged_attention(*args)
    assert got.dtype == q_dtype
    rtol, atol = (2**-7, 1e-3) if in_c else (2e-2, 2e-2)
    torch.testing.assert_close(got.float(), reference.paged_attention(*args).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
def test_int8_cache_matches_reference(case, q_dtype, cpu_path, monkeypatch):
    """An int8 KV cache (kernels.kv_int8: int8 values and a float32 scale a row). bf16 q on a CPU with AVX512-BF16 and
    VNNI and head_dim a multiple of 32 takes the C loop (integer products of the int8 values with q and P quantized to
    int16, the scales applied in float32): within one bf16 rounding of the reference on the same rows; every other
    case dequantizes the context for SDPA."""
    q, k_cache, v_cache, *rest = paged_case(**CASES[case], dtype=q_dtype)
    k_cache, v_cache = kv_int8.quantize(k_cache * 3), kv_int8.quantize(v_cache)  # * 3: scales other than V's
    head_dim = CASES[case]["head_dim"]
    in_c = (cpu_path == "native" and q_dtype == torch.bfloat16 and head_dim % 32 == 0
            and {"avx512_bf16", "avx512bw", "avx512_vnni"} <= cpu_info().flags)
    if in_c:
        monkeypatch.setattr(attention, "_attend_all_sdpa", _fail("the SDPA path ran"))
    got = attention.paged_attention(q, k_cache, v_cache, *rest)
    assert got.dtype == q_dtype
    rtol, atol = (2**-7, 1e-3) if in_c else (2e-2, 2e-2)
    expected = reference.paged_attention(q, k_cache, v_cache, *rest).float()
    torch.testing.assert_close(got.float(), expected, rtol=rtol, atol=atol)


def test_int8_rows_hold_values_and_scale():
    x = torch.tensor([[0.5, -1.27, 0.0, 0.01], [0.0, 0.0, 0.0, 0.0]])
    rows = kv_int8.quantize(x)
    assert rows.dtype == torch.int8 and rows.shape == (2, 8)
    assert rows[0, :4].tolist() == [50, -127, 0, 1] and rows[1, :4].tolist() == [0, 0, 0, 0]
    assert rows[:, 4:].contiguous().view(torch.float32).flatten().tolist() == [pytest.approx(0.01), 0.0]
    torch.testing.assert_close(kv_int8.dequantize(rows), torch.tensor([[0.5, -1.27, 0.0, 0.01], [0.0] * 4]))


def test_bfloat16_dot_products_where_the_cpu_has_them():
    """On a CPU with AVX512-BF16 the bf16 build takes its vdpbf16ps path (the cases above then test that path)."""
    library = native.load("paged_attention", ("ACT_BF16", "KV_BF16"))
    assert library is not None, "the C kernel did not build: a C compiler is part of the CPU setup"
    expected = int({"avx512_bf16", "avx512bw"} <= cpu_info().flags)
    assert library.paged_attention_bf16_dots() == expected, f"avx512_bf16 in cpu flags: {bool(expected)}"


def test_int8_cache_takes_integer_products_where_the_cpu_has_them():
    """The int8 build's C loop needs AVX512-VNNI beside AVX512-BF16 (vpdpwssd); elsewhere attention.reads_int8_in_c
    is False and an int8 cache goes through SDPA (the int8 test above covers both)."""
    library = native.load("paged_attention", ("ACT_BF16", "KV_INT8"))
    assert library is not None, "the C kernel did not build: a C compiler is part of the CPU setup"
    expected = int({"avx512_bf16", "avx512bw", "avx512_vnni"} <= cpu_info().flags)
    assert library.paged_attention_bf16_dots() == expected
    assert attention.reads_int8_in_c(torch.bfloat16) == bool(expected)


def test_amx_prefill_where_the_cpu_has_it():
    """On a CPU with AMX-BF16 (and a kernel that grants the tile state) the bf16 build runs prefill on AMX tiles (the
    prefill-amx cases above then test that path)."""
    library = native.load("paged_attention", ("ACT_BF16", "KV_BF16"))
    assert library is not None, "the C kernel did not build: a C compiler is part of the CPU setup"
    expected = int({"amx_bf16", "amx_tile", "avx512_bf16", "avx512bw"} <= cpu_info().flags)
    assert library.paged_attention_amx() == expected, f"amx_bf16 in cpu flags: {bool(expected)}"


def test_amx_prefill_of_a_long_prompt_in_bfloat16():
    """Many 32-key steps of the online softmax (a 1000-token prompt, scores spread wide) stay within one bf16 rounding
    of the float32 reference on the same values."""
    q, k_cache, v_cache, *rest = paged_case([1000, 300], [1000, 200], num_q_heads=9, num_kv_heads=3, head_dim=64,
                                            block_size=16, seed=5, dtype=torch.bfloat16)
    q = (q.float() * 3).to(torch.bfloat16)  # sharper softmax: the row maxima move from step to step
    got = attention.paged_attention(q, k_cache, v_cache, *rest)
    expected = reference.paged_attention(q, k_cache, v_cache, *rest).float()
    torch.testing.assert_close(got.float(), expected, rtol=2**-7, atol=1e-3)


def _fail(message):
    def fail(*args, **kwargs):
        raise AssertionError(message)

    return fail


def test_metadata_edited_in_place_is_honoured():
    q, k, v, tables, lens, starts, scale = paged_case([12, 30], [1, 1], num_q_heads=4, num_kv_heads=2, head_dim=16,
                                                      block_size=4)
    first = attention.paged_attention(q, k, v, tables, lens, starts, scale)
    lens[1] = 20  # edited in place between calls
    second = attention.paged_attention(q, k, v, tables, lens, starts, scale)
    torch.testing.assert_close(second, reference.paged_attention(q, k, v, tables, lens, starts, scale))
    assert not torch.allclose(first[1], second[1])


def test_write_kv_scatters_and_skips_minus_one():
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([3, 17, -1, 0, 9])
    caches = [torch.zeros(6, 4, 2, 8) for _ in range(4)]
    reference.write_kv(k, v, caches[0], caches[1], slots)
    with kernels.use_backend("cpu"):
        kernels.write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert int((caches[2] != 0).any(-1).any(-1).sum()) == 4


def test_write_kv_accepts_strided_values():
    qkv = torch.randn(3, 3 * 16)
    v = qkv[:, 32:].view(3, 2, 8)  # a view into a fused projection output, as the model passes it
    k = torch.randn(3, 2, 8)
    k_cache, v_cache = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    attention.write_kv(k, v, k_cache, v_cache, torch.tensor([1, 2, 7]))
    assert torch.equal(v_cache.view(-1, 2, 8)[[1, 2, 7]], v)


@pytest.mark.parametrize(
    ("edit", "match"),
    [(lambda a: a.__setitem__(3, a[3][:1]), "block_tables"),  # tables for fewer sequences
     (lambda a: a.__setitem__(0, a[0][..., :8]), "heads/dim"),  # head_dim mismatch
     (lambda a: a[4].__setitem__(0, 200), "block table"),  # context beyond its table
     (lambda a: a[3].__setitem__((1, 0), 10**6), "block id"),  # block outside the cache
     (lambda a: a[4].__setitem__(1, 1), "queries exceed")],  # 3 queries, context of 1
)
def test_inconsistent_metadata_is_refused_before_touching_memory(edit, match):
    args = list(paged_case([12, 30], [1, 3], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4))
    edit(args)
    with pytest.raises(ValueError, match=match):
        attention.paged_attention(*args)


def test_a_failed_build_falls_back_to_torch(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    native.load.cache_clear()
    try:
        assert native.load("paged_attention") is None
        assert "pure-torch path" in caplog.text and not list(tmp_path.iterdir())
        args = paged_case([9, 20], [1, 2], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4)
        torch.testing.assert_close(attention.paged_attention(*args), reference.paged_attention(*args))
    finally:
        native.load.cache_clear()


def test_native_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("KERNELS_CPU_NATIVE", "maybe")
    native.load.cache_clear()
    try:
        with pytest.raises(ValueError, match="KERNELS_CPU_NATIVE"):
            native.load("paged_attention")
    finally:
        native.load.cache_clear()
