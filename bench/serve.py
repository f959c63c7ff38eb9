"""Online serving: the engine server under Poisson load, against offline ``LLM.generate`` on the same workload.

``python -m bench.serve [--quick] [--model NAME_OR_PATH] [--rates 0.25,0.5,0.8]``

Measured in one run on this machine:
  * offline: ``LLM.generate`` on the whole workload in this process (output tok/s), before the server starts;
  * saturation: the server (``python -m engine serve``, a child process) with every request sent at once;
  * Poisson arrivals at fractions of the saturation request rate: TTFT, TPOT, ITL and e2e percentiles (vLLM's
    ``bench serve`` metrics) and throughput.
The load client shares the machine's cores with the server, so its CPU share is reported beside each run.
Results go to ``bench/results/serve-<time>.json`` and ``.png``; the last lines printed are the ratios.
"""

import argparse
import asyncio
import json
import os
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.throughput import RESULTS, make_workload

API_KEY = "bench-serve-key"


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int
    ttft: float
    e2e: float
    itls: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    label: str
    rate: float | None  # requests/s; None = all at once
    duration_s: float
    output_tok_s: float
    requests_ok: int
    requests_failed: int
    client_cpu_share: float  # client CPU seconds / (wall seconds x cores)
    server_cpu_share: float
    latency: dict  # metric -> {"p50", "p90", "p99", "mean"} in ms


async def one_request(http: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> RequestResult:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = None
    itls, usage = [], None
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return RequestResult(False, len(prompt), 0, 0.0, time.perf_counter() - started)
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            now = time.perf_counter()
            if event["choices"] and event["choices"][0].get("text"):
                if first is None:
                    first = now
                else:
                    itls.append(now - last)
                last = now
            usage = event.get("usage") or usage
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    return RequestResult(tokens == max_tokens, len(prompt), tokens, (first or end) - started, end - started, itls)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    array = np.asarray(values) * 1000
    return {"p50": float(np.percentile(array, 50)), "p90": float(np.percentile(array, 90)),
            "p99": float(np.percentile(array, 99)), "mean": float(array.mean())}


async def run_load(url: str, prompts: list[list[int]], max_tokens: int, rate: float | None, seed: int,
                   server_pid: int, label: str) -> RunResult:
    import psutil

    server = psutil.Process(server_pid)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(prompts) + 8)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    cpu0, server_cpu0 = time.process_time(), sum(server.cpu_times()[:2])
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as http:
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(one_request(http, prompt, max_tokens)))
            if rate is not None:
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - started
    cores = os.cpu_count() or 1
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return RunResult(
        label, rate, duration, sum(r.output_tokens for r in results) / duration, len(ok), len(results) - len(ok),
        (time.process_time() - cpu0) / (duration * cores),
        (sum(server.cpu_times()[:2]) - server_cpu0) / (duration * cores),
        {"ttft": percentiles([r.ttft for r in ok]), "tpot": percentiles(tpots),
         "itl": percentiles([x for r in ok for x in r.itls]), "e2e": percentiles([r.e2e for r in ok])},
    )


def offline_throughput(model: str, prompts: list[list[int]], max_tokens: int) -> float:
    from engine import LLM, SamplingParams

    llm = LLM(model, seed=0)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    del llm
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def start_server(model: str, port: int, log_path: Path):
    import subprocess

    from devstack.processes import python
    from devstack.services import wait_for_port

    env = {**os.environ, "ENGINE_API_KEY": API_KEY, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "wb")  # owned by the child for its lifetime
    proc = subprocess.Popen(python("-m", "engine", "serve", model, "--port", str(port), "--served-model-name",
                                   "bench", "--no-enable-lora"), env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, 300, "engine server", proc)
    return proc


def plot(results: list[RunResult], offline: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    poisson = [r for r in results if r.rate is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rates = [r.rate for r in poisson]
    for metric in ("ttft", "tpot", "e2e"):
        ax1.plot(rates, [r.latency[metric]["p50"] for r in poisson], marker="o", label=f"{metric} p50")
        ax1.plot(rates, [r.latency[metric]["p99"] for r in poisson], marker="x", linestyle="--",
                 label=f"{metric} p99")
    ax1.set_xlabel("request rate (req/s)")
    ax1.set_ylabel("ms")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7)
    ax1.set_title("latency under Poisson load")
    labels = ["offline LLM.generate"] + [r.label for r in results]
    ax2.bar(labels, [offline] + [r.output_tok_s for r in results], color=["gray"] + ["tab:blue"] * len(results))
    ax2.set_ylabel("output tok/s")
    ax2.tick_params(axis="x", rotation=30, labelsize=7)
    ax2.set_title("throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller workload, a few minutes")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rates", default="0.25,0.5,0.8", help="fractions of the saturation request rate")
    parser.add_argument("--port", type=int, default=8199)
    args = parser.parse_args(argv)
    from devstack.services import free_port
    from engine.models.prepare import resolve_model

    folder = resolve_model(args.model)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.quick, vocab)
    prompts, max_tokens = workload.prompts, workload.output_tokens
    print(f"workload: {len(prompts)} requests, prompts {workload.min_prompt}-{workload.max_prompt} tokens, "
          f"{max_tokens} output tokens", flush=True)
    offline = offline_throughput(str(folder), prompts, max_tokens)
    print(f"offline LLM.generate: {offline:.1f} output tok/s", flush=True)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    port = args.port if args.port else free_port()
    proc = start_server(str(folder), port, RESULTS / f"serve-{stamp}.server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        runs = [asyncio.run(run_load(url, prompts, max_tokens, None, 0, proc.pid, "saturation"))]
        saturation_rate = len(prompts) / runs[0].duration_s
        print(f"server at saturation: {runs[0].output_tok_s:.1f} output tok/s "
              f"({saturation_rate:.2f} req/s; client CPU {runs[0].client_cpu_share:.0%})", flush=True)
        for fraction in (float(f) for f in args.rates.split(",")):
            rate = fraction * saturation_rate
            run = asyncio.run(run_load(url, prompts, max_tokens, rate, 1, proc.pid, f"{fraction:.0%} load"))
            runs.append(run)
            print(f"{run.label}: {rate:.2f} req/s, TTFT p50 {run.latency['ttft']['p50']:.0f} ms "
                  f"p99 {run.latency['ttft']['p99']:.0f} ms, TPOT p50 {run.latency['tpot']['p50']:.0f} ms, "
                  f"{run.output_tok_s:.1f} tok/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    ratio = runs[0].output_tok_s / offline
    report = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
              "model": args.model, "workload": {"requests": len(prompts), "output_tokens": max_tokens,
                                                "prompt_range": [workload.min_prompt, workload.max_prompt]},
              "offline_tok_s": offline, "runs": [asdict(r) for r in runs],
              "saturation_vs_offline": ratio, "target": 0.8,
              "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    (RESULTS / f"serve-{stamp}.json").write_text(json.dumps(report, indent=2))
    plot(runs, offline, RESULTS / f"serve-{stamp}.png")
    print(f"results: bench/results/serve-{stamp}.json")
    print(f"server at saturation / offline LLM.generate: {ratio:.2f} (target >= 0.80)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
