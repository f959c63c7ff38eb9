"""Structured outputs: constrained decoding against free decoding in whole engine steps, grammar compile times, and
vLLM's CPU build with its structured outputs on the same workload, in the same run.

``python -m bench.structured [--quick] [--systems engine,vllm] [--batches 1,8,64] [--backends guidance,xgrammar]
[--max-tokens N] [--repeats N] [--timeout S]``

Workload: the 30-schema suite of the tests (``tests/structured/schema_suite.py``), each schema's prompt through
SmolLM2-135M-Instruct's chat template. At each batch size B, N requests (schemas cycled) with B sequences at most
in a step: N = 8, 64, 256 for B = 1, 8, 64 (``--quick``: 2, 16, 96), more than B so that finished requests are
replaced and most steps run at the full batch. They run once constrained, every one to its schema (greedy, no
whitespace between JSON tokens, ``max_tokens`` 256, ``--quick`` 128), then free: the same prompts unconstrained,
each request's output as long as its constrained one (EOS ignored), so both runs have the same schedule step for
step; an untimed round of both first (oneDNN builds a primitive per new batch shape, the grammars their lexer
states lazily: one-time costs the first timed run would pay alone), then ``repeats`` times, the order swapped
every repeat (3, ``--quick`` 1).

* This engine (``LLM.generate``, dtype auto, every core, in this process), once per backend: output tok/s both
  ways, mean step time over the pure decode steps at the full batch constrained and free and their ratio (the
  overhead; target at most 10% at batch 64), the share of those steps in the mask fill, the mask as a whole (fill
  + apply) and the matchers' advance (``bench.structured_engine.StepProbe``), and validity (every output parses
  and validates with ``jsonschema``, formats included).
* Compile time of every suite schema, cold (a fresh backend and cache per pass; 3 passes, ``--quick`` 1),
  p50/p99 per backend, in this process.
* vLLM 0.32's CPU build (``bench.peers_install``), once per backend (its ``structured_outputs_config`` backend of
  the same name), in a child process with a time limit, both cores bound (``VLLM_CPU_OMP_THREADS_BIND``), the
  engine's dtype, a fresh ``LLM`` per batch size (``max_num_seqs`` = B): the same requests through
  ``bench/structured_vllm.py``; tok/s both ways and validity. A peer that fails is a result with its error's tail
  (and the batch sizes it finished).

Results: ``bench/results/structured-<time>.json`` (rewritten after each stage, logs beside it);
``python -m bench.report`` puts them in its "Structured outputs" table. Other jobs share the cores: compare figures
within one run.
"""

import argparse
import json
import os
import subprocess
import time
import traceback
from pathlib import Path

from bench import peers_http as http
from bench import structured_summary as summary
from bench.peers_install import install_vllm, tail, vllm_python
from bench.peers_models import hf_copy

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
DRIVER = Path(__file__).resolve().parent / "structured_vllm.py"
SYSTEMS, BACKENDS = ("engine", "vllm"), ("guidance", "xgrammar")


def settings(quick: bool) -> dict:
    if quick:
        return {"requests": {1: 2, 8: 16, 64: 96}, "repeats": 1, "max_tokens": 128, "compile_passes": 1,
                "timeout": 1200}
    return {"requests": {1: 8, 8: 64, 64: 256}, "repeats": 3, "max_tokens": 256, "compile_passes": 3,
            "timeout": 2400}


def plan_requests(batches: list[int], requests: dict[int, int], num_schemas: int) -> dict[int, list[int]]:
    """The suite index of each request of each batch size, cycling through the suite; a size that ``requests`` does
    not name gets twice its batch (more requests than seats, so that finished ones are replaced)."""
    return {batch: [i % num_schemas for i in range(requests.get(batch, 2 * batch))] for batch in batches}


def failed(reason: str, detail: str = "") -> dict:
    lines = reason.strip().splitlines() or ["?"]
    return {"ok": False, "reason": lines[0][:500], "error": (detail + "\n" + reason)[-4000:]}


def run_engine(backend: str, work: dict, settings_: dict, model: str) -> dict:
    from bench.structured_engine import engine_batches

    try:
        return engine_batches(backend, work["prompts"], work["schemas"], work["plan"], settings_["max_tokens"],
                              settings_["repeats"], model)
    except Exception as error:  # noqa: BLE001 - a failed run is a result, reported with its traceback's tail
        return failed(f"{type(error).__name__}: {error}", traceback.format_exc())


def run_vllm(backend: str, work: dict, settings_: dict, model_folder: Path, dtype: str, logs: Path) -> dict:
    name = f"vllm-{backend}"
    spec = {"model": str(hf_copy(model_folder)), "dtype": dtype, "backend": backend, "prompts": work["prompts"],
            "schemas": work["schemas"], "batches": {str(b): r for b, r in work["plan"].items()},
            "max_tokens": settings_["max_tokens"], "repeats": settings_["repeats"],
            "out": str(logs / f"{name}.result.json")}
    spec_path, log = logs / f"{name}.spec.json", logs / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    env = http.vllm_env("all")
    base = {"vllm_env": {k: v for k, v in env.items() if k.startswith("VLLM_CPU")}, "log": str(log)}
    try:
        install_vllm()
    except Exception as error:  # noqa: BLE001 - a peer that cannot be installed is a result too
        return {**base, **failed(f"install failed: {error}")}
    with log.open("wb") as out:  # its own process group: on a timeout vLLM's engine and workers go too
        proc = subprocess.Popen([str(vllm_python()), "-P", str(DRIVER), str(spec_path)], stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT, start_new_session=True)
    try:
        code, problem = proc.wait(settings_["timeout"]), None
    except subprocess.TimeoutExpired:
        http.kill_group(proc)
        code, problem = None, f"timed out after {settings_['timeout']:.0f} s (log {log})"
    out = Path(spec["out"])
    done = json.loads(out.read_text()) if out.exists() else {}  # rewritten after each batch size it finished
    if problem is None and (code != 0 or not done.get("ok")):
        problem = f"exit code {code}: {(tail(log, 1).strip() or 'no output')[:300]}"
    return {**base, **done} if problem is None else {**base, **done, **failed(problem, tail(log))}


def resolved_dtype(model: str) -> str:
    """What ``dtype="auto"`` gives this engine here (vLLM runs at the same)."""
    from engine.config import EngineConfig, ModelConfig
    from engine.llm_engine import resolve_model_folder

    config = EngineConfig(model=model)
    return str(config.torch_dtype(ModelConfig.from_folder(resolve_model_folder(model)))).removeprefix("torch.")


def summarize(report: dict, schemas: list[dict], validate) -> dict:
    out = {"compile": {b: summary.compile_summary(c["samples_ms"], c["errors"])
                       for b, c in report["compile"].items()}, "systems": {}}
    for key, result in report["runs"].items():
        if result.get("batches"):  # a peer cut short keeps the batch sizes it finished
            out["systems"][key] = summary.batch_rows(result, schemas, validate)
    for backend in report["backends"]:
        engine, peer = out["systems"].get(f"engine-{backend}"), out["systems"].get(f"vllm-{backend}")
        out.setdefault("ratios", {})[backend] = summary.ratios(engine, peer) if engine and peer else []
        out.setdefault("target_met", {})[backend] = summary.target_met(engine) if engine else None
    return out


def print_summary(report: dict) -> None:
    s = report["summary"]
    for backend, c in s["compile"].items():
        if c["compiles"]:
            print(f"compile {backend}: p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms over {c['compiles']} "
                  f"compiles ({c['refused']} refused)")
    for key, result in report["runs"].items():
        if not result.get("ok"):
            print(f"{key}: FAILED: {result['reason'][:200]}")
        for row in s["systems"].get(key, []):
            steps = row.get("steps") or {}
            step = "" if steps.get("overhead") is None else (
                f"; step {steps['free_step_ms']:.1f} -> {steps['constrained_step_ms']:.1f} ms "
                f"({steps['overhead']:+.1%}), mask {steps['mask_share']:.1%} of the step")
            if steps.get("overhead_outside_forward") is not None:
                step += (f"; outside the forward {steps['free_outside_forward_ms']:.1f} -> "
                         f"{steps['constrained_outside_forward_ms']:.1f} ms ({steps['overhead_outside_forward']:+.1%} "
                         f"of a free step), forward {steps['forward_ratio']:+.1%}")
            v = row["validity"]
            print(f"{key} batch {row['batch']}: {row['free']['tok_s']:.1f} tok/s free, "
                  f"{row['constrained']['tok_s']:.1f} constrained{step}; valid {v['valid']}/{v['outputs']}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, one repeat (make bench)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per vLLM run")
    args = parser.parse_args(argv)
    systems, backends = _split(args.systems, SYSTEMS, parser), _split(args.backends, BACKENDS, parser)
    try:
        batches = sorted({int(b) for b in args.batches.split(",")})
    except ValueError:
        parser.error(f"--batches takes comma-separated sizes, got {args.batches!r}")
    if batches[0] < 1:
        parser.error("--batches must be at least 1")
    s = settings(args.quick)
    s.update({k: v for k, v in (("max_tokens", args.max_tokens), ("repeats", args.repeats),
                                ("timeout", args.timeout)) if v is not None})
    return run(args.model, args.quick, systems, backends, batches, s)


def _split(value: str, allowed, parser) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or any(v not in allowed for v in items):
        parser.error(f"expected a comma-separated subset of {','.join(allowed)}, got {value!r}")
    return items


def run(model: str, quick: bool, systems: list[str], backends: list[str], batches: list[int], s: dict) -> dict:
    from transformers import AutoTokenizer

    from bench.peers import machine
    from bench.structured_engine import chat_prompts, compile_times
    from engine.models.prepare import resolve_model
    from engine.structured import GrammarTokenizer
    from tests.structured.schema_suite import SUITE, validate

    model_folder = Path(resolve_model(model))
    suite = [{"name": n, "prompt": p, "schema": schema} for n, p, schema in SUITE]
    schemas = [e["schema"] for e in suite]
    work = {"prompts": chat_prompts(AutoTokenizer.from_pretrained(model_folder), suite), "schemas": schemas,
            "plan": plan_requests(batches, s["requests"], len(suite))}
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, logs = RESULTS / f"structured-{stamp}.json", RESULTS / f"structured-{stamp}"
    logs.mkdir(exist_ok=True)
    dtype = resolved_dtype(model)
    import torch

    report = {"model": model, "quick": quick, "dtype": dtype, "settings": {**s, "batches": batches},
              "backends": backends, "systems": systems, "suite": [e["name"] for e in suite],
              "machine": {**machine(), "torch_threads": torch.get_num_threads()}, "compile": {}, "runs": {}}

    def save() -> None:
        report["summary"] = summarize(report, schemas, validate)
        report["machine"]["load_avg_end"] = os.getloadavg()
        path.write_text(json.dumps(report, indent=2, default=str))

    tokenizer = GrammarTokenizer.from_pretrained(model_folder)
    for backend in backends:
        report["compile"][backend] = compile_times(tokenizer, backend, schemas, s["compile_passes"])
        save()
    for system in systems:
        for backend in backends:
            print(f"{system} {backend} ...", flush=True)
            if system == "engine":
                report["runs"][f"engine-{backend}"] = run_engine(backend, work, s, model)
            else:
                report["runs"][f"vllm-{backend}"] = run_vllm(backend, work, s, model_folder, dtype, logs)
            save()
    print_summary(report)
    print(f"results: {path} (logs in {logs}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return report


if __name__ == "__main__":
    main()
