"""GEMM paths against F.linear, the kernel's bands, and the per-machine choice: timed once, cached, reused."""

import json

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.cpu_info import CpuInfo, cpu_info
from engine.models import gemm_choice
from engine.models.gemm import PATHS, GemmPath, LinearKernel, available_paths
from engine.models.linear import Projection
from kernels.cpu import gemv as gemv_kernels

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = [[5, 6, 7, 8, 9], list(range(40, 71))]
# With one path there is nothing to time: the choice is fixed and nothing is cached.
needs_onednn = pytest.mark.skipif("onednn" not in available_paths("cpu", torch.float32), reason="no oneDNN here")


@pytest.fixture
def gemm_cache(tmp_path, monkeypatch):
    """An empty GEMM cache directory of the test's own."""
    monkeypatch.setenv("ENGINE_GEMM_CACHE_DIR", str(tmp_path))
    return tmp_path


@needs_onednn
def test_this_torch_build_has_onednn_for_fp32_and_for_bf16_where_the_cpu_has_it():
    gemv_f32 = ("gemv",) if gemv_kernels.available(torch.float32) else ()  # kernels/cpu/gemv.c, any CPU
    flags = cpu_info().flags
    packed_f32 = ("packed",) if "avx512f" in flags or {"avx2", "fma"} <= flags else ()  # kernels/cpu/packed_gemm.c
    assert available_paths("cpu", torch.float32) == ("torch", "onednn") + gemv_f32 + packed_f32
    # oneDNN's bf16 needs AVX-512 (its own check, not ours): an AVX2-only CPU runs bf16 on F.linear alone
    bf16 = ("torch", "onednn") if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ("torch",)
    # kernels/cpu/gemv.c and packed_gemm.c: tests/kernels/test_gemv.py and test_packed_gemm.py
    dots = ("gemv", "packed") if "avx512_bf16" in cpu_info().flags else ()
    widened = ("widened",) if "avx512f" in flags else ()  # bf16 panels on FMAs (packed_gemm.c)
    assert available_paths("cpu", torch.bfloat16) == bf16 + dots + widened
    assert "widened" not in available_paths("cpu", torch.float32)
    assert available_paths("cuda", torch.bfloat16) == ("torch",)  # cuBLAS through F.linear, nothing else


# (out, in, bias): SmolLM2-135M's q|k|v and down, odd sizes with a bias, and a tiny one
SHAPES = [(960, 576, False), (576, 1536, False), (37, 100, True), (8, 16, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES)
def test_every_path_computes_f_linear(dtype, out_features, in_features, bias):
    """Each path against F.linear in fp32 on the same (dtype-rounded) values. fp32: only the summation order
    differs (1e-5). bf16: fp32 sums, then one rounding of the output to bf16 (2^-8 relative; 2^-7 allowed)."""
    g = torch.Generator().manual_seed(out_features)
    weight = (torch.randn(out_features, in_features, generator=g) / in_features**0.5).to(dtype)  # [out, in]
    b = torch.randn(out_features, generator=g).to(dtype) if bias else None  # [out]
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (2**-7, 1e-3)
    for path in available_paths("cpu", dtype):
        kernel = LinearKernel(weight, b, [(1, path)])
        for m in (1, 7, 64, 300):
            x = torch.randn(m, in_features, generator=g).to(dtype)  # [M, in]
            expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
            got = kernel(x)
            assert got.dtype == dtype and got.shape == (m, out_features)
            torch.testing.assert_close(got.float(), expected, rtol=rtol, atol=atol, msg=f"{path} at M={m}")


def test_the_kernel_runs_the_path_of_each_token_counts_band(monkeypatch):
    for name in ("a", "b"):  # paths that say which ran
        monkeypatch.setitem(PATHS, name, GemmPath(name, lambda w: w, lambda x, w, bias, tag=name: tag))
    kernel = LinearKernel(torch.zeros(4, 4), None, [(2, "a"), (8, "b")])
    assert [kernel(torch.zeros(m, 4)) for m in (1, 2, 3, 8, 9, 100)] == ["a", "a", "b", "b", "b", "b"]
    with pytest.raises(ValueError, match="bands"):
        LinearKernel(torch.zeros(4, 4), None, [(2, "cublas")])


def test_a_path_is_timed_and_chosen_only_up_to_its_max_tokens(monkeypatch):
    """A path with max_tokens (the bf16 GEMV: four) is called at no larger M while timing and counts 0 GFLOP/s
    there, so no band past it takes it, however fast its calls would be."""
    calls = []

    def fast(x, weight, bias):
        calls.append(x.shape[0])
        return x @ weight.t()

    monkeypatch.setitem(PATHS, "small", GemmPath("small", lambda w: w, fast, max_tokens=2))
    projection = Projection("model.layers.0.mlp", 16, [("down_proj", 16)], bias=False)
    group = gemm_choice.GemmGroup("down_proj", [projection], 8, paths=("torch", "small"))
    table, _ = gemm_choice._time_group(group, torch.float32)
    assert table["tokens"] == [1, 2, 4, 8] and set(calls) == {1, 2}
    assert table["small"][2:] == [0.0, 0.0] and all(value > 0 for value in table["torch"])
    assert all(path == "torch" for limit, path in gemm_choice._pick(table) if limit > 2)


def test_small_m_is_timed_over_whole_cycles_each_path_on_another_layer(monkeypatch):
    """Up to _COLD_TOKENS rows a path's time is a whole cycle through the layers (every layer once a cycle), and paths
    that share a weight never read the same layer one after the other: `gemv` timed right after `torch` on the plain
    weight read it from the cache and won M = 1 where it loses a real step. Above it, single calls as before."""
    calls = []

    def recorder(name):
        def run(x, weight, bias):
            calls.append((name, x.shape[0], weight.data_ptr()))
            return x @ weight.t()
        return run

    monkeypatch.setitem(PATHS, "first", GemmPath("first", lambda w: w, recorder("first")))
    monkeypatch.setitem(PATHS, "second", GemmPath("second", lambda w: w, recorder("second")))  # the same weight
    layers = [Projection(f"model.layers.{i}.mlp", 16, [("down_proj", 16)], bias=False) for i in range(6)]
    for projection in layers:
        projection.weight.copy_(torch.randn(16, 16))
    group = gemm_choice.GemmGroup("down_proj", layers, 32, paths=("first", "second"))
    gemm_choice._time_group(group, torch.float32)
    weights = {projection.weight.data_ptr() for projection in layers}
    small = [call for call in calls if call[1] == 1]
    assert len(small) == 2 * len(layers) * gemm_choice._MIN_CYCLES
    for name in ("first", "second"):
        mine = [pointer for who, _, pointer in small if who == name]
        for cycle in range(gemm_choice._MIN_CYCLES):  # every layer once a cycle
            assert set(mine[cycle * len(layers):(cycle + 1) * len(layers)]) == weights
    assert all(a[2] != b[2] for a, b in zip(small, small[1:], strict=False))  # never one layer twice in a row
    large = [call for call in calls if call[1] == 32]  # once, or twice where it read as a dip (_dips)
    assert 2 * gemm_choice._MIN_ROUNDS <= len(large) <= 2 * 2 * gemm_choice._MAX_ROUNDS


def test_dips_are_the_counts_where_a_path_falls_below_both_neighbours():
    # rows: per token count, each path's GFLOP/s; M = 1 (index 0) is never a dip, a 0 (past max_tokens) never counts
    assert gemm_choice._dips([[10, 5], [20, 9], [40, 17], [60, 30]]) == []
    assert gemm_choice._dips([[10, 5], [20, 9], [12, 17], [60, 30]]) == [2]  # path 0 at index 2
    assert gemm_choice._dips([[10, 5], [20, 9], [40, 17], [60, 11]]) == [3]  # the last count against the one before
    assert gemm_choice._dips([[10, 5], [20, 9], [35, 17], [60, 30]]) == []  # within _DIP of the lower neighbour
    assert gemm_choice._dips([[1, 5], [20, 0], [40, 0]]) == []


def test_a_count_that_dips_is_timed_again_and_keeps_the_faster_reading(monkeypatch):
    """A burst of other work over one token count's few calls (here: a path slow on its first calls at M = 32, each
    longer than the timing's budget, so there are _MIN_ROUNDS of them) reads as a dip against M = 16 and 64, so M = 32
    is timed once more and the path keeps its second, faster reading."""
    calls, slow = [], {"left": gemm_choice._MIN_ROUNDS}
    burden = torch.randn(256, 256)

    def bursty(x, weight, bias):
        calls.append(x.shape[0])
        if x.shape[0] == 32 and slow["left"] > 0:  # every call of the first timing at M = 32
            slow["left"] -= 1
            for _ in range(30):
                burden @ burden
        return x @ weight.t()

    monkeypatch.setitem(PATHS, "bursty", GemmPath("bursty", lambda w: w, bursty))
    projection = Projection("model.layers.0.mlp", 16, [("down_proj", 16)], bias=False)
    group = gemm_choice.GemmGroup("down_proj", [projection], 64, paths=("torch", "bursty"))
    first_reading = {}
    real_dips = gemm_choice._dips

    def spy(rows):
        first_reading["bursty"] = rows[5][1]
        return real_dips(rows)

    monkeypatch.setattr(gemm_choice, "_dips", spy)
    table, _ = gemm_choice._time_group(group, torch.float32)
    assert table["tokens"] == [1, 2, 4, 8, 16, 32, 64]
    at_32 = [i for i, m in enumerate(calls) if m == 32]
    assert any(i > calls.index(64) for i in at_32)  # timed again after the last count
    assert table["bursty"][5] > 10 * first_reading["bursty"] > 0


@needs_onednn
def test_a_projection_bound_to_a_prepacked_path_lets_go_of_its_plain_weight():
    projection = Projection("model.layers.0.mlp", 16, [("gate_proj", 8), ("up_proj", 8)], bias=True)
    projection.weight.copy_(torch.randn(16, 16))
    projection.bias.copy_(torch.randn(16))
    x = torch.randn(3, 16)
    expected = projection(x)
    projection.use_kernel(LinearKernel(projection.weight, projection.bias, [(4, "onednn")]))
    assert projection.weight is None
    torch.testing.assert_close(projection(x), expected, rtol=1e-5, atol=1e-5)


def test_bands_take_the_fastest_path_unless_the_usual_one_is_close():
    table = {"tokens": [1, 2, 4, 8, 16], "torch": [10.0, 20.0, 30.0, 110.0, 95.0],  # GFLOP/s
             "onednn": [10.5, 40.0, 60.0, 104.0, 150.0]}
    # onednn wins 4 of 5 counts; at M=8 torch is faster, by less than the margin
    assert gemm_choice._pick(table) == [(16, "onednn")]
    table["torch"][0] = 20.0  # twice as fast at M=1: a band of its own
    assert gemm_choice._pick(table) == [(1, "torch"), (16, "onednn")]


def _layer_groups(num_layers: int = 30):
    """SmolLM2's q|k|v and o in every layer (the cost weighed is each call's FLOPs), and a vocabulary projection."""
    def group(name, n, k, layers):
        return gemm_choice.GemmGroup(
            name, [Projection(f"model.layers.{i}.x", k, [(name, n)], bias=False) for i in range(layers)], 512)

    return [group("q_proj+k_proj+v_proj", 960, 576, num_layers), group("o_proj", 576, 576, num_layers),
            group("lm_head", 64, 576, 1)]


def test_bands_move_to_a_c_path_where_the_python_a_replay_saves_outweighs_the_slower_gemm():
    """At M = 1 torch beats gemv by 12% (q|k|v: 68 us a call against 76, 30 layers: 0.24 ms a step): the replay saves
    more (3 ms), so both layer projections move. At M = 512, past what a replay takes, nothing moves; at M = 256
    packed is 2x slower than onednn for q|k|v (about 30 ms a step more): no move. The vocabulary is never replayed."""
    groups = _layer_groups()
    tokens = [1, 2, 256, 512]
    qkv = {"tokens": tokens, "torch": [16.3, 38.0, 300.0, 300.0], "onednn": [9.0, 20.0, 340.0, 350.0],
           "gemv": [14.5, 32.7, 0.0, 0.0], "packed": [13.8, 32.7, 170.0, 170.0]}
    o = {"tokens": tokens, "torch": [17.0, 39.4, 300.0, 300.0], "onednn": [8.0, 17.0, 330.0, 330.0],
         "gemv": [14.8, 29.1, 0.0, 0.0], "packed": [13.9, 31.4, 320.0, 320.0]}
    lm = {"tokens": [1, 2], "torch": [20.0, 40.0], "gemv": [10.0, 20.0]}
    bands = {"q_proj+k_proj+v_proj": [(2, "torch"), (512, "onednn")], "o_proj": [(2, "torch"), (512, "onednn")],
             "lm_head": [(2, "torch")]}
    moved, moves = gemm_choice._replayable(bands, {"q_proj+k_proj+v_proj": qkv, "o_proj": o, "lm_head": lm}, groups)
    assert moved == {"q_proj+k_proj+v_proj": [(2, "gemv"), (512, "onednn")],
                     "o_proj": [(1, "gemv"), (2, "packed"), (512, "onednn")], "lm_head": [(2, "torch")]}
    assert [(m["group"], m["tokens"], m["from"], m["to"]) for m in moves] == [
        ("q_proj+k_proj+v_proj", 1, "torch", "gemv"), ("o_proj", 1, "torch", "gemv"),
        ("q_proj+k_proj+v_proj", 2, "torch", "gemv"), ("o_proj", 2, "torch", "packed")]

    qkv["gemv"][:2] = [1.6, 3.8]  # ten times slower at M <= 2: about 19 ms a step more for q|k|v alone
    o["gemv"][:2] = o["packed"][:2] = [1.7, 3.9]
    assert gemm_choice._replayable(bands, {"q_proj+k_proj+v_proj": qkv, "o_proj": o, "lm_head": lm}, groups) == (
        bands, [])


def test_no_move_where_a_layer_projection_has_no_c_path_or_no_times():
    groups = _layer_groups()
    tokens = [1, 2]
    qkv = {"tokens": tokens, "torch": [16.0, 38.0], "gemv": [15.0, 36.0]}
    o = {"tokens": tokens, "torch": [17.0, 39.0], "onednn": [9.0, 18.0]}  # no C path for o at all
    bands = {"q_proj+k_proj+v_proj": [(2, "torch")], "o_proj": [(2, "torch")], "lm_head": [(2, "torch")]}
    assert gemm_choice._replayable(bands, {"q_proj+k_proj+v_proj": qkv, "o_proj": o}, groups) == (bands, [])
    # o fixed by the config (no times): nothing is weighed
    assert gemm_choice._replayable(bands, {"q_proj+k_proj+v_proj": qkv}, groups) == (bands, [])


def test_token_counts_are_powers_of_two_up_to_the_limit():
    group = gemm_choice.GemmGroup("o_proj", [], 100)
    assert group.token_counts() == [1, 2, 4, 8, 16, 32, 64, 100]
    group.max_tokens = 1
    assert group.token_counts() == [1]


@needs_onednn
def test_first_start_times_and_writes_the_cache_and_a_restart_reads_it(tiny_llama, gemm_cache, monkeypatch):
    first = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, max_num_batched_tokens=64)
    stats = first.llm_engine.stats()["gemm"]
    assert stats["source"] == "measured" and stats["dtype"] == "float32" and stats["mode"] == "auto"
    kernels = first.llm_engine.stats()["kernels"]  # every C kernel the engine asked for built on this CPU
    assert kernels["failed"] == {} and (kernels["loaded"] or not kernels["enabled"])
    assert set(stats["bands"]) == {"q_proj+k_proj+v_proj", "o_proj", "gate_proj+up_proj", "down_proj", "lm_head"}
    assert stats["bands"]["lm_head"][-1]["max_tokens"] == 64  # min(max_num_seqs, max_num_batched_tokens)
    assert stats["gflops"]["o_proj"]["tokens"] == [1, 2, 4, 8, 16, 32, 64]
    files = list(gemm_cache.iterdir())
    assert [str(f) for f in files] == [stats["cache_file"]]
    entry = json.loads(files[0].read_text())
    assert entry["key"]["torch"] == torch.__version__ and entry["key"]["threads"] == torch.get_num_threads()
    assert entry["key"]["dtype"] == "float32" and "onednn" in entry["key"]["paths"]
    expected = [o.outputs[0].token_ids for o in first.generate(PROMPTS, GREEDY, use_tqdm=False)]

    def no_timing(*args, **kwargs):
        raise AssertionError("a restart timed the GEMMs again")

    monkeypatch.setattr(gemm_choice, "_time_group", no_timing)
    second = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, max_num_batched_tokens=64)
    again = second.llm_engine.stats()["gemm"]
    assert again["source"] == "cache" and again["bands"] == stats["bands"] and again["gflops"] == stats["gflops"]
    assert [o.outputs[0].token_ids for o in second.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected


@needs_onednn
def test_another_cpu_dtype_or_shape_is_timed_again_and_a_broken_file_too(tiny_llama, gemm_cache, monkeypatch):
    def start(**kwargs):
        llm = LLM(str(tiny_llama), num_kv_blocks=64, block_size=4, max_num_batched_tokens=32, **kwargs)
        return llm.llm_engine.stats()["gemm"]

    first = start(dtype="float32")
    bf16_paths = len(available_paths("cpu", torch.bfloat16))  # one path (AVX2-only CPUs) leaves nothing to time
    assert start(dtype="bfloat16")["source"] == ("measured" if bf16_paths > 1 else "fixed")
    assert start(dtype="float32", max_num_seqs=8)["source"] == "measured"  # lm_head sees at most 8 rows
    monkeypatch.setattr(gemm_choice, "cpu_info", lambda: CpuInfo("Another CPU", frozenset({"avx2"})))
    assert start(dtype="float32")["source"] == "measured"
    monkeypatch.undo()
    monkeypatch.setenv("ENGINE_GEMM_CACHE_DIR", str(gemm_cache))
    assert start(dtype="float32")["source"] == "cache"
    with open(first["cache_file"], "w") as file:
        file.write('{"key": "truncated')
    assert start(dtype="float32")["source"] == "measured"
    assert start(dtype="float32")["source"] == "cache"  # rewritten whole
    assert len(list(gemm_cache.glob("*.json"))) == (4 if bf16_paths > 1 else 3) and not list(gemm_cache.glob("*.tmp"))


@needs_onednn
def test_a_choice_timed_on_a_busy_machine_serves_its_run_and_is_not_cached(tiny_llama, gemm_cache, monkeypatch,
                                                                          caplog):
    monkeypatch.setattr(gemm_choice, "_MIN_CPU_SHARE", 2.0)  # no run gets twice its threads' time: always busy
    for _ in range(2):
        llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, max_num_batched_tokens=16)
        assert llm.llm_engine.stats()["gemm"]["source"] == "measured"
    assert not list(gemm_cache.iterdir()) and "the next start times again" in caplog.text


@needs_onednn
def test_a_busy_timing_keeps_each_projections_majority_path_only(tiny_llama, gemm_cache, monkeypatch):
    """Under load a band's winner is noise: one path per projection, the one that won most of its bands."""
    def timed(group, dtype):  # oneDNN fastest everywhere but at M = 1, where the load made torch look faster
        tokens = group.token_counts()
        table = {"tokens": tokens, "torch": [50.0 if m == 1 else 10.0 for m in tokens],
                 "onednn": [20.0 for _ in tokens]}
        return table, {name: [PATHS[name].pack(p.gemm_weight) for p in group.projections] for name in group.paths}

    monkeypatch.setattr(gemm_choice, "_time_group", timed)
    monkeypatch.setattr(gemm_choice, "_MIN_CPU_SHARE", 2.0)  # always busy
    busy = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, max_num_batched_tokens=16)
    bands = busy.llm_engine.stats()["gemm"]["bands"]
    assert all([band["path"] for band in value] == ["onednn"] for value in bands.values()), bands
    monkeypatch.setattr(gemm_choice, "_MIN_CPU_SHARE", 0.0)  # quiet: the bands stand as timed
    quiet = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4, max_num_batched_tokens=16)
    assert quiet.llm_engine.stats()["gemm"]["bands"]["o_proj"][0] == {"max_tokens": 1, "path": "torch"}


@pytest.mark.parametrize("variant", ["tiny_llama", "tiny_llama_tied_bias"])  # the tied lm_head keeps the embedding
def test_a_fixed_path_does_no_timing(variant, request, gemm_cache, monkeypatch):
    folder = request.getfixturevalue(variant)
    monkeypatch.setattr(gemm_choice, "_time_group", lambda *a, **k: pytest.fail("timed a fixed path"))
    plain = LLM(str(folder), dtype="float32", gemm="torch", num_kv_blocks=64, block_size=4)
    stats = plain.llm_engine.stats()["gemm"]
    assert stats["source"] == "fixed" and stats["cache_file"] is None
    assert all(band == [{"max_tokens": band[0]["max_tokens"], "path": "torch"}] for band in stats["bands"].values())
    model = plain.llm_engine.model_runner.model
    assert all(p.kernel is None for p in model.modules() if isinstance(p, Projection))  # F.linear, as before
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, GREEDY, use_tqdm=False)]
    for path in ("onednn", "packed"):
        if path not in available_paths("cpu", torch.float32):
            continue
        fixed = LLM(str(folder), dtype="float32", gemm=path, num_kv_blocks=64, block_size=4)
        model = fixed.llm_engine.model_runner.model
        assert all(p.kernel.paths == {path} for p in model.modules() if isinstance(p, Projection))
        assert [o.outputs[0].token_ids for o in fixed.generate(PROMPTS, GREEDY, use_tqdm=False)] == expected, path
    assert not list(gemm_cache.iterdir())


def test_a_path_this_machine_lacks_is_refused(tiny_llama, monkeypatch):
    monkeypatch.setattr(gemm_choice, "available_paths", lambda device_type, dtype: ("torch",))
    with pytest.raises(ValueError, match="gemm='onednn'"):
        LLM(str(tiny_llama), gemm="onednn", num_kv_blocks=64, block_size=4)
