"""A hot adapter over two engine replicas: the gateway's replica choice (``gateway.replicas.ReplicaPool``, the
code the gateway runs) in front of two engine servers of one core each.

``python -m bench.replicas [--quick] [--model NAME_OR_PATH] [--seconds S] [--max-num-seqs N]``

In one run, with one hot adapter kept at twice what one replica seats (a closed loop of ``2 x max_num_seqs``
requests in flight) and eight cold adapters asked one request at a time:
  * single: the pool holds one replica, so the hot adapter gets one replica's throughput;
  * spread: the pool holds both; the hot adapter's set grows to two (gateway/replicas.py), the cold ones stay on
    their rendezvous replica.
Reports the hot adapter's output tok/s both ways and the ratio (target >= 1.7x), how many replicas each cold
adapter's requests reached (target: one each) and the engines' adapter-slot hit rate from ``/stats``. The Django
half of the gateway (auth, quota, metering) is not in the loop: this measures placement, not the gateway's cost
(``bench.gateway`` does that). Each engine is pinned to its own core (``taskset``); the load client shares them.
Results: ``bench/results/replicas-<time>.json``.
"""

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.peers_install import cache_root
from bench.throughput import RESULTS

API_KEY = "bench-replicas-key"
OUTPUT_TOKENS = 32


def start_engine(model: Path, port: int, core: int, max_num_seqs: int, adapters_root: Path, log: Path):
    from devstack.services import wait_for_port

    env = {**os.environ, "ENGINE_API_KEY": API_KEY, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "engine", "serve", str(model), "--port", str(port),
           "--served-model-name", "bench", "--max-num-seqs", str(max_num_seqs), "--max-loras", "4",
           "--adapter-sources", str(adapters_root), "--max-waiting", "4096"]
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, 300, f"engine on core {core}", proc)
    return proc


async def one(pool, http: httpx.AsyncClient, key: str, adapter: dict, prompt: list[int]) -> tuple[str, int]:
    """One request routed as the gateway routes it: the pool's first candidate, open while it runs."""
    replica = (await pool.candidates(key))[0]
    pool.opened(replica, key)
    try:
        response = await http.post(f"{replica.url}/v1/completions", json={
            "model": adapter["id"], "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True,
            "adapter": adapter})
        if response.status_code != 200:
            raise RuntimeError(f"{replica.url}: {response.status_code} {response.text[:400]}")
        return replica.url, response.json()["usage"]["completion_tokens"]
    finally:
        pool.closed(replica, key)


async def run(urls: list[str], hot: dict, cold: list[dict], seconds: float, concurrency: int, seed: int) -> dict:
    from gateway.replicas import ReplicaPool

    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(headers=headers, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency + 32)) as http:
        pool = ReplicaPool(urls, http, API_KEY, ttl_s=0.5)
        await pool.refresh()
        deadline = time.perf_counter() + seconds
        hot_tokens, cold_seen = [0], {c["id"]: set() for c in cold}

        async def hot_worker():
            while time.perf_counter() < deadline:
                _, tokens = await one(pool, http, hot["id"], hot, [rng.randrange(100, 40000) for _ in range(64)])
                hot_tokens[0] += tokens

        async def cold_worker():
            while time.perf_counter() < deadline:
                adapter = rng.choice(cold)
                url, _ = await one(pool, http, adapter["id"], adapter, [rng.randrange(100, 40000) for _ in range(64)])
                cold_seen[adapter["id"]].add(url)

        started = time.perf_counter()
        await asyncio.gather(*(hot_worker() for _ in range(concurrency)), cold_worker())
        elapsed = time.perf_counter() - started
        stats = [(await http.get(f"{url}/stats")).json()["adapters"] for url in urls]
        spread = pool.spread_of(hot["id"])
    hits, misses = sum(s["hits"] for s in stats), sum(s["misses"] for s in stats)
    return {"replicas": len(urls), "seconds": elapsed, "hot_tok_s": hot_tokens[0] / elapsed, "hot_spread": spread,
            "cold_replicas_reached": {k: len(v) for k, v in cold_seen.items()},
            "slot_hits": hits, "slot_misses": misses, "slot_hit_rate": hits / max(1, hits + misses)}


def main(argv: list[str] | None = None) -> int:
    from bench.lora_workload import adapter_folders
    from devstack.services import free_port
    from engine.models.prepare import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 s per run instead of 60")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    args = parser.parse_args(argv)
    seconds = args.seconds or (20.0 if args.quick else 60.0)
    model = resolve_model(args.model)
    root = cache_root() / "replica-adapters"
    folders = adapter_folders(model, 9, 16, root)
    adapters = [{"id": f"adp-{i}", "uri": str(folder)} for i, folder in enumerate(folders)]
    hot, cold = adapters[0], adapters[1:]
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    ports = [free_port(), free_port()]
    procs = [start_engine(model, port, core, args.max_num_seqs, root, RESULTS / f"replicas-{stamp}-engine{core}.log")
             for core, port in enumerate(ports)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    concurrency = 2 * args.max_num_seqs
    try:
        asyncio.run(run(urls, hot, cold, 5.0, 2, seed=0))  # warm-up: adapters loaded, first steps paid
        single = asyncio.run(run(urls[:1], hot, cold, seconds, concurrency, seed=1))
        spread = asyncio.run(run(urls, hot, cold, seconds, concurrency, seed=2))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    ratio = spread["hot_tok_s"] / single["hot_tok_s"]
    report = {"model": str(model), "max_num_seqs": args.max_num_seqs, "concurrency": concurrency,
              "single": single, "spread": spread, "hot_ratio": ratio}
    path = RESULTS / f"replicas-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"hot adapter: one replica {single['hot_tok_s']:.1f} tok/s, two {spread['hot_tok_s']:.1f} tok/s "
          f"(set of {spread['hot_spread']}): {ratio:.2f}x")
    print(f"cold adapters reached {sorted(set(spread['cold_replicas_reached'].values()))} replica(s) each; "
          f"slot hit rate {spread['slot_hit_rate']:.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
