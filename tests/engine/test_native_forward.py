"""The decoder layers replayed as recorded C kernel calls (engine.models.native_forward) against the module path:
the same hidden states and the same KV cache, bit for bit, over prefill chunks and decodes, in each dtype and GEMM
path the replay takes; and the steps it leaves to the modules."""

import pytest
import torch

import kernels
from engine import LLM, SamplingParams
from engine.batch_metadata import BatchMetadata
from engine.config import ModelConfig
from engine.models import gemm, native_forward
from engine.models.gemm import LinearKernel
from engine.models.linear import LoRAWeights
from engine.models.loader import load_model
from kernels import kv_int8
from kernels.cpu import attention, gemv, int8_gemm, packed_gemm, program
from tests.support.batches import step_batch

BLOCK = 4
NUM_BLOCKS = 80


def _paths(dtype: torch.dtype) -> list[str]:
    return [path for path in ("gemv", "packed", "widened") if path in gemm.available_paths("cpu", dtype)]


def _model(folder, dtype: torch.dtype, bands, quantization: str | None = None):
    config = ModelConfig.from_folder(folder)
    model = load_model(folder, config, dtype=dtype, device=torch.device("cpu"), max_positions=512,
                       quantization=quantization)
    for layer in model.layers:
        for projection in native_forward._projections(layer):
            projection.use_kernel(LinearKernel(projection.gemm_weight, projection.bias, bands))
    return model


def _bind_cache(model, dtype: torch.dtype):
    c = model.config
    k = torch.zeros(c.num_layers, NUM_BLOCKS, BLOCK, c.num_kv_heads, kv_int8.row_elements(c.head_dim, dtype),
                    dtype=dtype)
    v = torch.zeros_like(k)
    model.bind_kv_cache(list(k), list(v))
    return k, v


def _batch(chunks) -> tuple[torch.Tensor, BatchMetadata]:
    return step_batch(chunks, BLOCK)


A = list(range(5, 40))  # 35 tokens
B = list(range(100, 109))
TABLE_A, TABLE_B = [3, 7, 1, 12, 5, 6, 30, 31, 32, 33, 40], [9, 8, 20, 21, 22]
STEPS = [  # a prompt in two chunks beside a whole one, then decodes of one and of two sequences
    [(A[:20], 0, TABLE_A), (B, 0, TABLE_B)],
    [(A[20:], 20, TABLE_A), ([7], 9, TABLE_B)],
    [([11], 35, TABLE_A)],
    [([12], 36, TABLE_A), ([13], 10, TABLE_B)],
    [([14], 37, TABLE_A), ([15], 11, TABLE_B)],
]


def _run_steps(model, native: bool, dtype: torch.dtype, steps=STEPS, token_slots=None, kv_dtype=None):
    """The steps' hidden states and the KV cache after them (of ``kv_dtype``, the model's by default);
    ``token_slots(step index, num_tokens)``: the adapter slot of each token of a step (a list), or None for none."""
    k, v = _bind_cache(model, kv_dtype or dtype)
    if native:
        assert model.use_native_forward()
    outputs = []
    with torch.inference_mode():
        for i, step in enumerate(steps):
            ids, batch = _batch(step)
            if token_slots is not None:
                batch.token_slots = torch.tensor(token_slots(i, ids.shape[0]), dtype=torch.int32)
            outputs.append(model(ids, batch).clone())
    return outputs, k, v


def _bind_random_adapters(model, dtype: torch.dtype, num_slots: int = 3, rank: int = 8) -> None:
    """Every projection of every layer gets ``num_slots`` random rank-``rank`` adapter slots, slot 1 scaled 0."""
    gen = torch.Generator().manual_seed(7)
    for layer in model.layers:
        for projection in native_forward._projections(layer):
            parts = len(projection.output_slices)
            a = torch.randn(num_slots, parts * rank, projection.in_features, generator=gen) * 0.2
            b = torch.randn(num_slots, projection.out_features, rank, generator=gen) * 0.2
            scales = torch.tensor([0.5, 0.0, 2.0][:num_slots])
            projection.lora = LoRAWeights(a.to(dtype), b.to(dtype), scales,
                                          torch.full((num_slots,), rank, dtype=torch.int32))
    if model.native is not None:
        model.native.adapters_bound()


def _replays(monkeypatch) -> list[int]:
    runs = []
    original = program.Program.run

    def counted(self, values, times=None):
        runs.append(values[0])  # the step's token count
        return original(self, values, times)

    monkeypatch.setattr(program.Program, "run", counted)
    return runs


def _assert_same(native_run, module_run):
    (out_n, k_n, v_n), (out_m, k_m, v_m) = native_run, module_run
    for a, b in zip(out_n, out_m, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(k_n, k_m) and torch.equal(v_n, v_m)


pytestmark = pytest.mark.skipif(not program.available(), reason="no C compiler: the replay library is not built")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", ["tiny_llama", "tiny_llama_tied_bias"])
def test_a_replayed_step_computes_what_the_modules_do_bit_for_bit(variant, dtype, request, monkeypatch):
    paths = _paths(dtype)
    if not paths:
        pytest.skip(f"this CPU has no C GEMM for {dtype}")
    folder = request.getfixturevalue(variant)
    # decode sizes on gemv where it exists, the rest on packed where it exists: both kernels recorded
    bands = [(2, paths[0]), (4096, paths[-1])]
    model = _model(folder, dtype, bands)
    runs = _replays(monkeypatch)
    native = _run_steps(model, True, dtype)
    assert sorted(runs) == sorted(len(sum((c[0] for c in s), [])) for s in STEPS)  # every step was replayed
    stats = model.native.stats()
    assert stats["steps"] == len(STEPS) and not stats["disabled"]
    assert set(stats["kernel_seconds"]) == {"add_rms_norm", "gemm", "rotary_qkv", "attention", "silu_mul"}
    model.native = None
    _assert_same(native, _run_steps(model, False, dtype))


def test_an_int8_kv_cache_replays_where_attention_reads_it_in_c(tiny_llama_tied_bias, monkeypatch):
    """kv_cache_dtype="int8" (kernels.kv_int8): the recorded rotary call quantizes the rows as the module path's
    does, and the recorded attention reads them; where the C loop does not read int8 (no AVX512-BF16) the replay
    declines and the modules run."""
    dtype = torch.bfloat16
    paths = _paths(dtype)
    if not paths:
        pytest.skip(f"this CPU has no C GEMM for {dtype}")
    model = _model(tiny_llama_tied_bias, dtype, [(2, paths[0]), (4096, paths[-1])])  # head_dim 32
    if not attention.reads_int8_in_c(dtype):
        _bind_cache(model, torch.int8)
        assert not model.use_native_forward()
        return
    runs = _replays(monkeypatch)
    native = _run_steps(model, True, dtype, kv_dtype=torch.int8)
    assert sorted(runs) == sorted(len(sum((c[0] for c in s), [])) for s in STEPS)
    assert native[1].dtype == torch.int8 and native[1].any()
    model.native = None
    _assert_same(native, _run_steps(model, False, dtype, kv_dtype=torch.int8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_steps_with_adapters_replay_their_lora_ops_too(tiny_llama, dtype, monkeypatch):
    paths = _paths(dtype)
    if not paths:
        pytest.skip(f"this CPU has no C GEMM for {dtype}")
    model = _model(tiny_llama, dtype, [(2, paths[0]), (4096, paths[-1])])
    _bind_random_adapters(model, dtype)

    def token_slots(step: int, num_tokens: int) -> list[int]:  # base-model tokens beside three slots' runs
        return [[-1, 0, 2, 1][(step + t // 5) % 4] for t in range(num_tokens)]

    runs = _replays(monkeypatch)
    native = _run_steps(model, True, dtype, token_slots=token_slots)
    assert len(runs) == len(STEPS)
    model.native = None
    module = _run_steps(model, False, dtype, token_slots=token_slots)
    _assert_same(native, module)
    without = _run_steps(model, False, dtype)
    assert not torch.equal(module[0][0], without[0][0])  # the adapters changed the hidden states


@pytest.mark.skipif(not int8_gemm.available(), reason="the int8 kernel needs AVX512-VNNI or AVX2 + FMA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int8_weights_replay_on_the_int8_kernel(tiny_llama, dtype, monkeypatch):
    model = _model(tiny_llama, dtype, [(4096, "w8a8g")], quantization="int8")
    runs = _replays(monkeypatch)
    native = _run_steps(model, True, dtype)
    assert len(runs) == len(STEPS)
    model.native = None
    _assert_same(native, _run_steps(model, False, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int8_weights_on_their_dense_copy_replay_on_the_packed_kernel(tiny_llama, dtype, monkeypatch):
    """``dequantized`` (the GEMM choice took it for o_proj at M = 1 on the Zen 4 VM) is the packed kernel on a dense
    copy: replayed in C like ``packed``; before, such a band ran every step of its size on the module path (a decode
    step of one sequence 5.3-5.8 -> 9.1-9.5 ms)."""
    if not packed_gemm.available(dtype):
        pytest.skip(f"no {dtype} packed kernel on this CPU: the dense copy runs oneDNN, which is not replayed")
    model = _model(tiny_llama, dtype, [(4096, "dequantized")], quantization="int8")
    runs = _replays(monkeypatch)
    native = _run_steps(model, True, dtype)
    assert len(runs) == len(STEPS)
    model.native = None
    _assert_same(native, _run_steps(model, False, dtype))


def test_steps_a_program_cannot_take_run_the_modules(tiny_llama, monkeypatch):
    paths = _paths(torch.float32)
    if not paths:
        pytest.skip("this CPU has no C GEMM for float32")
    # up to 4 tokens on a C kernel, past that on torch's F.linear: no program for the prefill steps
    model = _model(tiny_llama, torch.float32, [(4, paths[0]), (4096, "torch")])
    runs = _replays(monkeypatch)
    native = _run_steps(model, True, torch.float32)
    assert runs == [1, 2, 2]  # the three decode steps; the two prefill steps (29 and 16 tokens) ran the modules
    model.native = None
    _assert_same(native, _run_steps(model, False, torch.float32))

    _bind_cache(model, torch.float32)
    model.use_native_forward()
    ids, batch = _batch([([1], 0, [0])])
    batch.token_slots = torch.tensor([0], dtype=torch.int32)  # a token with an adapter: the modules' LoRA
    assert model.native.forward(ids, batch) is None
    ids, batch = _batch([([1], 0, [0])])
    with kernels.use_backend("reference"):  # a forced backend: the modules run it
        assert model.native.forward(ids, batch) is None
    many = list(range(3, 3 + native_forward.MAX_TOKENS + 1))
    ids, batch = _batch([(many, 0, list(range(NUM_BLOCKS)))])
    assert model.native.forward(ids, batch) is None  # more tokens than the buffers hold


def test_bad_metadata_raises_what_the_module_path_raises(tiny_llama):
    paths = _paths(torch.float32)
    if not paths:
        pytest.skip("this CPU has no C GEMM for float32")
    model = _model(tiny_llama, torch.float32, [(4096, paths[-1])])
    for native in (True, False):
        _bind_cache(model, torch.float32)
        if native:
            assert model.use_native_forward()
        ids, batch = _batch([([1, 2], 0, [NUM_BLOCKS])])  # block past the cache: its slots too
        with pytest.raises(IndexError, match="slot"), torch.inference_mode():
            model(ids, batch)
        ids, batch = _batch([([1, 2], 0, [3])])
        batch.seq_lens[0] = 9  # a context longer than its block table
        with pytest.raises(ValueError, match="block table"), torch.inference_mode():
            model(ids, batch)


def test_no_replay_where_it_is_turned_off_or_a_projection_has_no_kernel(tiny_llama, monkeypatch):
    config = ModelConfig.from_folder(tiny_llama)
    model = load_model(tiny_llama, config, dtype=torch.float32, device=torch.device("cpu"), max_positions=512)
    _bind_cache(model, torch.float32)
    assert not model.use_native_forward()  # F.linear everywhere: nothing to record
    paths = _paths(torch.float32)
    if paths:
        model = _model(tiny_llama, torch.float32, [(4096, paths[-1])])
        _bind_cache(model, torch.float32)
        monkeypatch.setenv("ENGINE_NATIVE_FORWARD", "0")
        assert not model.use_native_forward()
        monkeypatch.setenv("ENGINE_NATIVE_FORWARD", "maybe")
        with pytest.raises(ValueError, match="ENGINE_NATIVE_FORWARD"):
            model.use_native_forward()
        monkeypatch.setenv("ENGINE_NATIVE_FORWARD", "1")
        assert model.use_native_forward()
        _bind_cache(model, torch.float32)  # a new cache: the recorded addresses are stale
        assert model.native is None


def test_program_fills_step_values_and_reports_the_op_that_failed():
    from kernels.cpu import silu_mul

    library = silu_mul._library(torch.float32)
    if library is None or not library.silu_mul_available():
        pytest.skip("silu_mul's C build needs AVX-512")
    gate_up = torch.randn(5, 32)
    out = torch.full((5, 16), float("nan"))
    recorded = program.Program(2)
    recorded.add(program.SILU_MUL, library.silu_mul,
                 (gate_up.data_ptr(), out.data_ptr(), program.Step(1), 16, program.Step(0)))
    values = (program.ctypes.c_int64 * 2)(1, 3)  # one thread, three rows
    times = program.KernelTimes()
    recorded.run(values, times)
    torch.testing.assert_close(out[:3], torch.nn.functional.silu(gate_up[:3, :16]) * gate_up[:3, 16:])
    assert torch.isnan(out[3:]).all()  # rows past the step's count untouched
    assert list(times.seconds()) == ["silu_mul"] and times.seconds()["silu_mul"] > 0

    with pytest.raises(ValueError, match="takes 5 arguments"):
        recorded.add(program.SILU_MUL, library.silu_mul, (0, 0, 1))
    with pytest.raises(ValueError, match="step value 2"):
        recorded.add(program.SILU_MUL, library.silu_mul, (0, 0, program.Step(2), 16, 1))
    prepared = gemv.prepare(torch.ones(8, 8))
    if prepared is not None:  # gemv_f32 refuses 5 rows (MAX_ROWS 4): the second op fails, the first ran
        x, y = torch.ones(5, 8), torch.zeros(5, 8)
        recorded.add(program.GEMM, prepared.kernel,
                     (x.data_ptr(), program.Step(1), prepared.weight.data_ptr(), None, 8, 8, y.data_ptr(), 1))
        values[1] = 5
        out.fill_(float("nan"))
        with pytest.raises(program.ProgramError) as failure:
            recorded.run(values, times)
        assert (failure.value.index, failure.value.status) == (1, -1)
        assert set(times.seconds()) == {"silu_mul", "gemm"}  # the failed op's time counts too
        assert not torch.isnan(out).any()


def test_engine_stats_say_what_the_replay_ran_and_where_its_time_went(tiny_llama):
    llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4)
    if llm.llm_engine.model_runner.model.native is None:
        pytest.skip("this model's projections have no C kernel on this CPU: nothing is replayed")
    llm.generate(["a b c", "d e f g h"], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    stats = llm.llm_engine.stats()
    replay = stats["native_forward"]
    assert replay["steps"] == stats["steps"] > 0 and not replay["disabled"]
    assert replay["kernel_seconds"]["gemm"] > 0 and replay["kernel_seconds"]["attention"] > 0
