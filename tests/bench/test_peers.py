"""``bench.peers``'s pure parts on made-up runs: the run plan and the ratios with their targets. The benchmark itself
runs in ``make bench``, not here (no timing is asserted)."""

import pytest

from bench.peers import plan
from bench.peers_ratios import summarize
from bench.peers_runs import INT8, INT8_KV


def test_plan_runs_this_engine_again_with_int8_weights_except_for_adapters():
    runs = plan(["engine", "vllm"], ["offline", "adapters", "streams"], ["float32"], ["all", "default"])
    engine = [(r["workload"], r["variant"], r.get("quantization")) for r in runs if r["system"] == "engine"]
    assert engine == [("offline", "both cores", None), ("offline", INT8, "int8"),
                      ("adapters", "both cores", None), ("adapters", "base model only", None),
                      ("streams", "both cores", None), ("streams", INT8, "int8")]
    vllm = [(r["workload"], r["variant"]) for r in runs if r["system"] == "vllm"]
    assert vllm == [("offline", "both cores"), ("offline", "its default binding"), ("adapters", "both cores"),
                    ("streams", "both cores")]
    assert not [r for r in plan(["engine"], ["offline"], ["float32"], ["all"], int8=False)
                if r.get("quantization")]


def test_plan_adds_an_int8_kv_cache_to_the_bf16_offline_run_where_asked():
    runs = plan(["engine"], ["offline", "streams"], ["bfloat16", "float32"], ["all"], int8_kv=True)
    fastest = [(r["workload"], r["dtype"]) for r in runs if r["variant"] == INT8_KV]
    assert fastest == [("offline", "bfloat16")]
    run = next(r for r in runs if r["variant"] == INT8_KV)
    assert run["quantization"] == "int8" and run["kv_cache_dtype"] == "int8"
    assert not [r for r in plan(["engine"], ["offline"], ["bfloat16"], ["all"]) if r["variant"] == INT8_KV]


def test_plan_reverses_the_systems_every_other_dtype():
    runs = plan(["engine", "vllm"], ["offline", "streams"], ["bfloat16", "float32"], ["all"], int8=False)
    order = [(r["workload"], r["dtype"], r["system"]) for r in runs]
    assert order == [("offline", "bfloat16", "engine"), ("offline", "bfloat16", "vllm"),
                     ("offline", "float32", "vllm"), ("offline", "float32", "engine"),
                     ("streams", "bfloat16", "engine"), ("streams", "bfloat16", "vllm"),
                     ("streams", "float32", "vllm"), ("streams", "float32", "engine")]


def offline(system, tok_s, variant="both cores", dtype="float32", **fields):
    return {"system": system, "workload": "offline", "dtype": dtype, "variant": variant, "ok": True,
            "tok_s": tok_s, **fields}


def streams(system, tpot, variant="both cores", **fields):
    run = {"tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 2 * tpot}, "tok_s": 1000 / tpot}
    return {"system": system, "workload": "streams", "dtype": "float32", "variant": variant, "ok": True,
            "runs": {"1": run}, **fields}


def test_same_precision_targets_read_the_plain_engine_and_best_against_best_its_fastest_mode():
    runs = [offline("engine", 200.0), offline("engine", 260.0, INT8, quantization="int8"),
            offline("vllm", 150.0), offline("vllm", 100.0, "its default binding"),
            streams("engine", 40.0), streams("engine", 25.0, INT8, quantization="int8"), streams("llama", 30.0)]
    summary = summarize(runs)
    same = [r for r in summary["ratios"] if r["workload"] == "offline" and r["dtype"] == "float32"]
    assert [(r["peer_run"], r["ratio"], r["target"]) for r in same] == [
        ("vLLM (both cores)", pytest.approx(200 / 150), 1.25), ("vLLM (its default binding)", 2.0, None)]
    [best] = [r for r in summary["ratios"] if r["workload"] == "offline, best against best"]
    assert best["engine_run"] == f"this engine ({INT8}, float32)" and best["ratio"] == pytest.approx(260 / 150)
    assert best["met"] is False  # target 2x
    tpot = [r for r in summary["ratios"] if r["workload"] == "streams-1" and r["measure"] == "TPOT p50 ms"]
    assert [(r["engine_run"], r["ratio"], r["target"], r["met"]) for r in tpot] == [
        ("this engine (both cores)", pytest.approx(40 / 30), 1.0, False),
        (f"this engine ({INT8})", pytest.approx(25 / 30), None, None)]  # int8 is information, not the target
    assert tpot[1]["short"] == "streams-1 fp32 int8 TPOT: vs llama.cpp"
