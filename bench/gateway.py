"""The gateway's own cost: one streaming workload sent straight to an engine and through the gateway, in one run.

``python -m bench.gateway [--rounds N] [--quick] [--model HF_FOLDER]``

One engine on a tiny random Llama (so the engine is fast and the gateway's cost is visible), one gateway process
(uvicorn, as deployed) in front of it with a tenant key, PostgreSQL when it answers on 127.0.0.1:5432 (a scratch
database, recreated) else SQLite, and Redis (a scratch database index). The same client (httpx, asyncio) sends
streaming completions (``ignore_eos``, fixed length) both ways, alternating direct and gateway blocks each round
so that the machine's background load hits both alike:

* time to first token (request sent -> first chunk carrying a generated token) at concurrency 1 and 4: the
  gateway's added p50 and p99 (gateway percentile minus direct percentile);
* the gateway process's CPU (user + system from /proc) per request over all its requests, and split into a
  fixed part per request and a part per streamed token (sequential streams of 1 and of 64 tokens);
* generated tokens per second at 16 concurrent streams, and the gateway's loss against direct: over all rounds
  (the headline), per round (each gateway block against the direct block next to it), and a 95% interval from
  resampling the rounds (this VM's speed drifts by a tenth within minutes; one block proves little).

Targets: under 10 ms added p50 TTFT, under 10% throughput loss. Results go to
``bench/results/gateway-<time>.json``; the last lines printed compare them with the targets.
"""

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway_stack import BenchStack, start_bench_stack

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "the quick brown fox jumps over the lazy dog near the river"
TARGET_ADDED_TTFT_MS = 10.0
TARGET_THROUGHPUT_LOSS = 0.10


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def one_stream(http: httpx.AsyncClient, url: str, key: str, max_tokens: int) -> tuple[float, int]:
    """(seconds to the first generated token, tokens generated) of one streaming completion."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    started = time.perf_counter()
    ttft, tokens = None, 0
    async with http.stream("POST", f"{url}/v1/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            usage = json.loads(line[6:]).get("usage") or {}
            tokens = usage.get("completion_tokens", tokens)
            if ttft is None and tokens > 0:
                ttft = time.perf_counter() - started
    if ttft is None or tokens != max_tokens:
        raise RuntimeError(f"{url}: stream ended after {tokens} of {max_tokens} tokens")
    return ttft, tokens


async def run_block(url: str, key: str, *, concurrency: int, num_requests: int, max_tokens: int) -> dict:
    """``num_requests`` streams, ``concurrency`` at a time: their TTFTs and the generated tokens per second."""
    ttfts: list[float] = []
    tokens = 0
    queue = list(range(num_requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        async def worker():
            nonlocal tokens
            while queue:
                queue.pop()
                ttft, generated = await one_stream(http, url, key, max_tokens)
                ttfts.append(ttft)
                tokens += generated

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"ttfts": ttfts, "tokens": tokens, "seconds": elapsed}


def measure(stack: BenchStack, args) -> dict:
    blocks = [("ttft_c1", 1, args.requests_c1, args.ttft_tokens), ("ttft_c4", 4, args.requests_c4, args.ttft_tokens),
              ("throughput_c16", 16, args.throughput_requests, args.throughput_tokens)]
    samples = {name: {"direct": [], "gateway": []} for name, *_ in blocks}
    gateway_cpu, gateway_requests, engine_cpu = 0.0, 0, {"direct": 0.0, "gateway": 0.0}
    for round_index in range(args.rounds):
        modes = ["direct", "gateway"] if round_index % 2 == 0 else ["gateway", "direct"]
        for name, concurrency, num_requests, max_tokens in blocks:
            for mode in modes:
                url, key = (stack.engine_url, stack.engine_key) if mode == "direct" else (stack.web_url, stack.key)
                cpu_before, engine_before = stack.gateway_cpu_s(), stack.engine_cpu_s()
                block = asyncio.run(run_block(url, key, concurrency=concurrency, num_requests=num_requests,
                                              max_tokens=max_tokens))
                engine_cpu[mode] += stack.engine_cpu_s() - engine_before
                if mode == "gateway":
                    gateway_cpu += stack.gateway_cpu_s() - cpu_before
                    gateway_requests += num_requests
                samples[name][mode].append(block)
                print(f"round {round_index + 1} {name:15s} {mode:8s} p50 TTFT "
                      f"{statistics.median(block['ttfts']) * 1000:7.2f} ms  {block['tokens'] / block['seconds']:8.1f}"
                      " tok/s", flush=True)
    return summarize(samples, gateway_cpu, gateway_requests, engine_cpu)


def gateway_cpu_split(stack: BenchStack, num_requests: int) -> dict:
    """The gateway's CPU per request (fixed) and per relayed token: sequential streams of 1 and of 64 tokens."""
    per_request = {}
    for max_tokens in (1, 64):
        before = stack.gateway_cpu_s()
        asyncio.run(run_block(stack.web_url, stack.key, concurrency=1, num_requests=num_requests,
                              max_tokens=max_tokens))
        per_request[max_tokens] = (stack.gateway_cpu_s() - before) * 1000 / num_requests
    per_token = (per_request[64] - per_request[1]) / 63
    return {"cpu_ms_per_request_of_1_token": per_request[1], "cpu_ms_per_request_of_64_tokens": per_request[64],
            "cpu_ms_per_token": per_token, "cpu_ms_per_request_fixed": per_request[1] - per_token}


def summarize(samples: dict, gateway_cpu: float, gateway_requests: int, engine_cpu: dict) -> dict:
    report = {"gateway_cpu_ms_per_request": gateway_cpu * 1000 / gateway_requests,
              "engine_cpu_s": engine_cpu, "blocks": {}}
    for name, modes in samples.items():
        entry = {}
        for mode, blocks in modes.items():
            ttfts = [t for block in blocks for t in block["ttfts"]]
            tokens = sum(block["tokens"] for block in blocks)
            seconds = sum(block["seconds"] for block in blocks)
            entry[mode] = {"ttft_p50_ms": percentile(ttfts, 0.5) * 1000, "ttft_p99_ms": percentile(ttfts, 0.99) * 1000,
                           "tokens_per_s": tokens / seconds, "num_requests": len(ttfts),
                           "per_round_tokens_per_s": [b["tokens"] / b["seconds"] for b in blocks]}
        entry["added_ttft_p50_ms"] = entry["gateway"]["ttft_p50_ms"] - entry["direct"]["ttft_p50_ms"]
        entry["added_ttft_p99_ms"] = entry["gateway"]["ttft_p99_ms"] - entry["direct"]["ttft_p99_ms"]
        entry["throughput_loss"] = 1 - entry["gateway"]["tokens_per_s"] / entry["direct"]["tokens_per_s"]
        entry["per_round_loss"] = [1 - g["tokens"] / g["seconds"] / (d["tokens"] / d["seconds"])
                                   for d, g in zip(modes["direct"], modes["gateway"], strict=True)]
        entry["throughput_loss_interval_95"] = loss_interval(modes["direct"], modes["gateway"])
        report["blocks"][name] = entry
    return report


def loss_interval(direct: list[dict], gateway: list[dict], draws: int = 4000, seed: int = 0) -> list[float]:
    """A 95% bootstrap interval of the overall loss: rounds resampled with replacement, each round keeping its
    direct and gateway blocks together (they ran minutes apart at most, on the same machine state)."""
    rng = random.Random(seed)
    rounds = list(zip(direct, gateway, strict=True))
    losses = []
    for _ in range(draws):
        sample = [rounds[rng.randrange(len(rounds))] for _ in rounds]
        rate = {mode: sum(pair[i]["tokens"] for pair in sample) / sum(pair[i]["seconds"] for pair in sample)
                for i, mode in enumerate(("direct", "gateway"))}
        losses.append(1 - rate["gateway"] / rate["direct"])
    return [percentile(losses, 0.025), percentile(losses, 0.975)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="default: 6, or 4 with --quick")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run, noisier numbers)")
    parser.add_argument("--model", default=None, help="an HF folder to serve (default: a tiny random Llama)")
    args = parser.parse_args(argv)
    scale = 0.25 if args.quick else 1.0
    args.rounds = args.rounds or (4 if args.quick else 6)
    args.requests_c1, args.requests_c4 = max(8, int(40 * scale)), max(16, int(80 * scale))
    args.throughput_requests = 128 if args.quick else 256  # blocks of a second or more: short ones are all noise
    args.ttft_tokens, args.throughput_tokens = 8, 64
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as scratch, start_bench_stack(
            Path(scratch), args.model) as stack:
        for url, key in ((stack.engine_url, stack.engine_key), (stack.web_url, stack.key)):  # warm both paths
            asyncio.run(run_block(url, key, concurrency=4, num_requests=16, max_tokens=8))
        report = measure(stack, args)
        report["gateway_cpu_split"] = gateway_cpu_split(stack, args.requests_c1)
    report.update(machine={"cpus": os.cpu_count(), "python": platform.python_version()},
                  settings={k: v for k, v in vars(args).items() if k != "model"}, database=stack.database)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"gateway-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print_verdict(report, path)
    return 0


def print_verdict(report: dict, path: Path) -> None:
    blocks = report["blocks"]
    print(f"\nresults: {path}")
    for name in ("ttft_c1", "ttft_c4"):
        block = blocks[name]
        print(f"{name}: direct p50 {block['direct']['ttft_p50_ms']:.2f} ms, gateway p50 "
              f"{block['gateway']['ttft_p50_ms']:.2f} ms: added p50 {block['added_ttft_p50_ms']:.2f} ms "
              f"(target < {TARGET_ADDED_TTFT_MS:.0f}), added p99 {block['added_ttft_p99_ms']:.2f} ms")
    c16 = blocks["throughput_c16"]
    low, high = c16["throughput_loss_interval_95"]
    print(f"throughput at 16 streams: direct {c16['direct']['tokens_per_s']:.0f} tok/s, gateway "
          f"{c16['gateway']['tokens_per_s']:.0f} tok/s: loss {c16['throughput_loss'] * 100:.1f}% "
          f"(95% interval {low * 100:.1f}% to {high * 100:.1f}%; target < {TARGET_THROUGHPUT_LOSS * 100:.0f}%); "
          "per round " + ", ".join(f"{loss * 100:.1f}%" for loss in c16["per_round_loss"]))
    split = report["gateway_cpu_split"]
    print(f"gateway CPU per request: {report['gateway_cpu_ms_per_request']:.2f} ms over the whole run; "
          f"{split['cpu_ms_per_request_fixed']:.2f} ms fixed + {split['cpu_ms_per_token']:.3f} ms per streamed token")


if __name__ == "__main__":
    raise SystemExit(main())
