"""The C rotary embedding and KV write (kernels/cpu/rotary_kv.c) give torch's numbers bit for bit: greedy outputs
must not depend on whether the C build is there."""

import pytest
import torch

import kernels
import kernels.reference as reference
from engine.models.rotary import RotaryEmbedding, apply_rotary
from kernels import kv_int8
from kernels.cpu import native, rotary_kv

DTYPES = [torch.float32, torch.bfloat16]
KV_DTYPES = [*DTYPES, torch.int8]  # int8: kernels.kv_int8's rows, quantized as they are written


@pytest.fixture
def torch_only(monkeypatch):
    """Run a block with the native kernels off (the torch formulas), then back on."""

    class Switch:
        def __enter__(self):
            monkeypatch.setenv("KERNELS_CPU_NATIVE", "0")
            native.load.cache_clear()

        def __exit__(self, *exc):
            monkeypatch.delenv("KERNELS_CPU_NATIVE")
            native.load.cache_clear()

    yield Switch()
    native.load.cache_clear()


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.int8 else x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)


def _caches(kv: torch.dtype) -> list[torch.Tensor]:  # 4 blocks of 16 slots of 3 kv heads of 64 (int8: + a scale)
    return [torch.zeros(4, 16, 3, kv_int8.row_elements(64, kv), dtype=kv) for _ in range(4)]


def _qkv(num_tokens: int, dtype: torch.dtype, seed: int = 0):
    """q and k as the model has them: [T, H, 64] views into one fused projection output, large values included."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(num_tokens, 960, generator=gen) * 4).to(dtype)
    return qkv[:, :576].view(num_tokens, 9, 64), qkv[:, 576:768].view(num_tokens, 3, 64), qkv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 5, 300])
def test_rotary_is_torch_bit_for_bit(dtype, num_tokens, torch_only):
    rotary = RotaryEmbedding(64, 8192, 100000.0, None)
    positions = torch.randint(0, 8192, (num_tokens,), generator=torch.Generator().manual_seed(1))
    cos, sin = rotary(positions)
    q, k, _ = _qkv(num_tokens, dtype)
    assert rotary_kv.rotary(q, cos, sin) is not None  # the C path ran
    got = [apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)]
    with torch_only:
        assert rotary_kv.rotary(q, cos, sin) is None
        expected = [apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)]
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == dtype and a.is_contiguous()
        assert torch.equal(_bits(a), _bits(b))


def test_rotary_leaves_other_layouts_to_torch():
    cos, sin = RotaryEmbedding(64, 64, 10000.0, None)(torch.arange(4))
    half_precision = torch.randn(4, 2, 64).half()
    heads_apart = torch.randn(4, 64, 2).transpose(1, 2)  # each head's values not contiguous
    for x in (half_precision, heads_apart):
        assert rotary_kv.rotary(x, cos, sin) is None
        x1, x2 = x[..., :32].float(), x[..., 32:].float()
        expected = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        torch.testing.assert_close(apply_rotary(x, cos, sin), expected)


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kv", KV_DTYPES)
def test_write_kv_matches_the_reference_for_every_dtype_pair(act, kv):
    _, k, qkv = _qkv(6, act, seed=2)
    v = qkv[:, 768:].view(6, 3, 64)  # strided, as the model passes it
    slots = torch.tensor([5, 40, -1, 0, 63, 17])
    caches = _caches(kv)
    reference.write_kv(k, v, caches[0], caches[1], slots)
    with kernels.use_backend("cpu"):
        kernels.write_kv(k, v, caches[2], caches[3], slots)
    assert rotary_kv.write_kv(k, v, caches[2], caches[3], slots)  # the C path applies to these tensors
    assert torch.equal(_bits(caches[0]), _bits(caches[2])) and torch.equal(_bits(caches[1]), _bits(caches[3]))
    assert int((caches[2] != 0).any(-1).any(-1).sum()) == 5  # the -1 row was skipped


def test_write_kv_refuses_a_slot_past_the_cache_before_writing():
    k, v = torch.randn(2, 3, 64), torch.randn(2, 3, 64)
    k_cache, v_cache = torch.zeros(2, 16, 3, 64), torch.zeros(2, 16, 3, 64)
    with pytest.raises(IndexError, match="past the cache"):
        rotary_kv.write_kv(k, v, k_cache, v_cache, torch.tensor([3, 32]))
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize("act", DTYPES)
@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("num_tokens", [6, 40])  # 40: split over the threads (from 8 tokens)
def test_rotary_qkv_is_the_split_path_bit_for_bit(act, kv, num_tokens, torch_only):
    """One C call for a layer (rotary of q and k, the KV write) against split + apply_rotary x2 + write_kv with the
    native kernels off: the same q and the same cache contents, the skipped slot's row untouched."""
    rotary = RotaryEmbedding(64, 8192, 100000.0, None)
    gen = torch.Generator().manual_seed(num_tokens)
    positions = torch.cat([torch.tensor([7, 300, 8191, 0, 4096, 12]), torch.randint(0, 8192, (34,), generator=gen)])
    cos, sin = rotary(positions[:num_tokens])
    _, _, qkv = _qkv(num_tokens, act, seed=3)
    slots = torch.randperm(64, generator=gen)[:num_tokens]
    slots[2] = -1
    caches = _caches(kv)
    q = rotary_kv.rotary_qkv(qkv, 9, 3, 64, cos, sin, caches[0], caches[1], slots)
    assert q is not None and q.shape == (num_tokens, 9, 64) and q.dtype == act
    with torch_only:
        assert rotary_kv.rotary_qkv(qkv, 9, 3, 64, cos, sin, caches[2], caches[3], slots) is None
        q_ref, k_ref, v_ref = qkv.split([576, 192, 192], dim=-1)
        expected_q = apply_rotary(q_ref.view(num_tokens, 9, 64), cos, sin)
        with kernels.use_backend("cpu"):
            kernels.write_kv(apply_rotary(k_ref.view(num_tokens, 3, 64), cos, sin), v_ref.view(num_tokens, 3, 64),
                             caches[2], caches[3], slots)
    assert torch.equal(_bits(q), _bits(expected_q))
    assert torch.equal(_bits(caches[0]), _bits(caches[2])) and torch.equal(_bits(caches[1]), _bits(caches[3]))
    assert int((caches[0] != 0).any(-1).any(-1).sum()) == num_tokens - 1


def test_rotary_qkv_refuses_a_slot_past_the_cache_and_other_layouts():
    cos, sin = RotaryEmbedding(64, 64, 10000.0, None)(torch.arange(2))
    qkv = torch.randn(2, 960)
    k_cache, v_cache = torch.zeros(2, 16, 3, 64), torch.zeros(2, 16, 3, 64)
    with pytest.raises(IndexError, match="past the cache"):
        rotary_kv.rotary_qkv(qkv, 9, 3, 64, cos, sin, k_cache, v_cache, torch.tensor([3, 32]))
    assert not k_cache.any() and not v_cache.any()
    slots = torch.tensor([0, 1])
    assert rotary_kv.rotary_qkv(qkv.half(), 9, 3, 64, cos, sin, k_cache, v_cache, slots) is None
    assert rotary_kv.rotary_qkv(qkv[:, :900], 9, 3, 64, cos, sin, k_cache, v_cache, slots) is None  # too narrow
    assert rotary_kv.rotary_qkv(qkv, 9, 3, 64, cos, sin, k_cache, v_cache, slots.int()) is None
