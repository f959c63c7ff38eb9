"""Fair service between two tenants through the engine server: a heavy tenant sending 10x the light one's requests,
together at 150% of the server's capacity, with fairness keys (VTC) and without (arrival order).

``python -m bench.fairness [--quick] [--model NAME_OR_PATH] [--seconds S] [--max-num-seqs N] [--repeats R]``

One server (``python -m engine serve``, a child process, ``--max-num-seqs`` seats) in one run:
  1. capacity: every request of a batch sent at once, requests/s;
  2. the light tenant alone at its share of the load (1/11 of 150% of capacity): its TTFT p50/p99;
  3. both tenants, Poisson arrivals, each request with its tenant's ``fairness_key`` (the gateway's keyed hash;
     here two fixed strings): the light tenant's TTFT against step 2 (target: p99 within 1.5x), the service each
     tenant got (weighted tokens, as the engine counts them, from ``/stats``), total output tok/s;
  4. the same arrivals without keys (first come, first served): what fairness changed, its light TTFT and the total
     throughput with keys against it (both pooled over the repeats: tokens over seconds, and over steps);
  5. two keys of weights 1 and 2, both backlogged (each sends its requests at once, the second twice as many): the
     service each got as the client saw it (prompt tokens at the first token, output tokens as they streamed, in
     the engine's weights) against VTC's bound on the gap between backlogged keys, and their service ratio
     (target 1:2).
Each run also reports the engine's mean step time and output tokens per step (from ``/metrics``): the first is what
one step of waiting costs, which the batch size and CPU contention move (``python -m bench.fairness_steps`` counts
the waits in steps instead); the second is the throughput the schedule gives, which contention does not move (with
keys it runs ~5% lower by design: a light tenant's prompt gets a step of its own, see ``engine.fairness``).
A light tenant at 1/11 of 150% of capacity sends few requests (about 18 in 90 s on a 2-core CPU), so one run's p99 is
its largest TTFT and swings from run to run; ``--repeats R`` runs steps 2, 3 and 4 R times, interleaved, each with
new arrivals, in reversed order every other repeat (:func:`run_order`: use an even R), and the ratios are taken over
the pooled samples (each repeat's own ratio is reported beside it): one run's throughput moves by a few percent with
the host, as much as the ~4% a step that keys cost by design.
Every request has a 64-128 token prompt of random ids (fresh ids each run, so no run reads another's prefix cache)
and 32 greedy output tokens (EOS ignored). The load client
shares the two cores with the server: the figures compare with each other, not with another run's.
Results: ``bench/results/fairness-<time>.json``; the last lines printed are the ratios.
"""

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
from pathlib import Path

import httpx

from bench.serve import API_KEY, RequestResult, percentiles
from bench.throughput import RESULTS

OUTPUT_TOKENS = 32
LIGHT, HEAVY = "tenant-light", "tenant-heavy"


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(rng.randint(64, 128))]


async def one(http: httpx.AsyncClient, ids: list[int], key: str | None) -> RequestResult:
    body = {"model": "bench", "prompt": ids, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if key is not None:
        body["fairness_key"] = key
    started = time.perf_counter()
    first, usage = None, None
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return RequestResult(False, len(ids), 0, 0.0, time.perf_counter() - started)
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and event["choices"] and event["choices"][0].get("text"):
                first = time.perf_counter()
            usage = event.get("usage") or usage
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else 0
    return RequestResult(tokens == OUTPUT_TOKENS, len(ids), tokens, (first or end) - started, end - started)


async def traced(http: httpx.AsyncClient, ids: list[int], key: str, weight: float, started: float) -> dict:
    """One streamed request of ``key`` at ``weight``: when each output token arrived (seconds since ``started``)."""
    body = {"model": "bench", "prompt": ids, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "fairness_key": key, "fairness_weight": weight}
    times, usage = [], None
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return {"prompt_tokens": len(ids), "token_times": [], "ok": False}
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0].get("text"):
                times.append(time.perf_counter() - started)
            usage = event.get("usage") or usage
    tokens = usage["completion_tokens"] if usage else 0
    # An event may carry more than one token (a multi-byte character held back): its last event counts the rest.
    times += times[-1:] * max(0, tokens - len(times))
    return {"prompt_tokens": len(ids), "token_times": times[:tokens], "ok": tokens == OUTPUT_TOKENS}


def service_gap(traces: dict[str, list[dict]], weights: dict[str, float], grid_s: float = 0.05) -> dict:
    """Each key's service as the client saw it, in the engine's weighted tokens over the key's weight (a prompt's
    tokens at its first token, each output token as it arrived), sampled every ``grid_s`` while both keys were
    backlogged: from the start until the first key whose last request got its first token (after that it has
    nothing waiting). The gap of VTC's bound is the most the difference of the two keys' service grew or shrank
    over any interval of that window: max(d) - min(d) for d(t) = service_a(t) - service_b(t)."""
    from engine.fairness import OUTPUT_WEIGHT, PREFILL_WEIGHT

    end = min(max(r["token_times"][0] for r in rs if r["token_times"]) for rs in traces.values())
    events = {key: sorted([(r["token_times"][0], PREFILL_WEIGHT * r["prompt_tokens"] / weights[key])
                           for r in rs if r["token_times"]]
                          + [(t, OUTPUT_WEIGHT / weights[key]) for r in rs for t in r["token_times"]])
              for key, rs in traces.items()}
    (a, ev_a), (b, ev_b) = events.items()
    gaps, served, i, j = [], {a: 0.0, b: 0.0}, 0, 0
    for step in range(int(end / grid_s + 1e-6) + 1):  # the grid up to and with the end
        t = step * grid_s
        while i < len(ev_a) and ev_a[i][0] <= t:
            served[a] += ev_a[i][1]
            i += 1
        while j < len(ev_b) and ev_b[j][0] <= t:
            served[b] += ev_b[j][1]
            j += 1
        gaps.append(served[a] - served[b])
    return {"window_s": end, "weighted_service": dict(served), "max_gap": max(gaps) - min(gaps),
            "raw_service_ratio": (served[b] * weights[b]) / (served[a] * weights[a]) if served[a] else None}


async def backlogged(url: str, capacity_req_s: float, seconds: float, max_num_seqs: int, seed: int) -> dict:
    """Two keys, weights 1 and 2, both backlogged: each sends its requests at once, the weight-2 key twice as many
    (about ``seconds`` of work in all). Their service (as the client saw it, :func:`service_gap`) against VTC's
    bound on two backlogged keys, 2U / w_min (Sheng et al., Theorem 4.5 with weights) with U = max(w_p * the longest
    prompt, w_q * the most tokens a batch holds), plus the engine's tie tolerance; and the most the engine's own
    counters spread (``/stats``, sampled as it ran)."""
    from engine.fairness import OUTPUT_WEIGHT, PREFILL_WEIGHT, TIE_TOLERANCE

    weights = {"tenant-w1": 1.0, "tenant-w2": 2.0}
    count = max(2 * max_num_seqs, round(capacity_req_s * seconds / 3))
    rng = random.Random(seed)
    plan = {key: [prompt(rng) for _ in range(round(count * weights[key]))] for key in weights}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=sum(len(p) for p in plan.values()) + 8)
    spreads = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=1200, limits=limits) as http:
        started = time.perf_counter()
        tasks = {key: [asyncio.create_task(traced(http, ids, key, weights[key], started)) for ids in prompts]
                 for key, prompts in plan.items()}
        pending = [task for ts in tasks.values() for task in ts]
        while not all(task.done() for task in pending):
            fairness = (await http.get("/stats")).json().get("fairness") or {}
            if fairness.get("backlogged_keys") == 2:
                spreads.append(fairness["counter_spread"])
            await asyncio.wait(pending, timeout=0.25)
        traces = {key: [task.result() for task in ts] for key, ts in tasks.items()}
    longest_prompt = max(len(ids) for prompts in plan.values() for ids in prompts)
    u = max(PREFILL_WEIGHT * longest_prompt, OUTPUT_WEIGHT * max_num_seqs * (longest_prompt + OUTPUT_TOKENS))
    bound = 2 * u / min(weights.values()) + TIE_TOLERANCE
    gap = service_gap(traces, weights)
    return {"weights": weights, "requests": {key: len(p) for key, p in plan.items()},
            "failed": sum(not r["ok"] for rs in traces.values() for r in rs), **gap, "bound": bound,
            "within_bound": gap["max_gap"] <= bound, "engine_counter_spread_max": max(spreads, default=None)}


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


async def step_totals(http: httpx.AsyncClient) -> tuple[float, int]:
    """The server's engine steps so far: (seconds, count), from ``/metrics``."""
    totals = {}
    for line in (await http.get("/metrics")).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("engine_step_seconds_sum", "engine_step_seconds_count"):
            totals[name] = float(value)
    return totals["engine_step_seconds_sum"], int(totals["engine_step_seconds_count"])


async def run(url: str, plan: list[tuple[float, str, list[int]]], keyed: bool) -> dict:
    """``plan``: (arrival s, tenant, prompt) in time order. Per tenant: TTFT percentiles, ok/failed, tok/s; the
    engine's mean step time and output tokens per step over the run (a wait of one step costs the former, which CPU
    contention moves; the latter is the throughput the scheduler decides, which it does not)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    limits = httpx.Limits(max_connections=len(plan) + 8)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=1200, limits=limits) as http:
        steps_before = await step_totals(http)
        preempted_before = ((await http.get("/stats")).json().get("fairness") or {}).get("preemptions", 0)
        tasks = []
        for at, tenant, ids in plan:
            delay = at - (time.perf_counter() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append((tenant, asyncio.create_task(one(http, ids, tenant if keyed else None))))
        results = [(tenant, await task) for tenant, task in tasks]
        stats = (await http.get("/stats")).json()
        steps_after = await step_totals(http)
    duration = time.perf_counter() - started
    step_s, num_steps = steps_after[0] - steps_before[0], steps_after[1] - steps_before[1]
    output_tokens = sum(r.output_tokens for _, r in results)
    out = {"duration_s": duration, "output_tok_s": output_tokens / duration, "steps": num_steps,
           "mean_step_ms": 1000 * step_s / num_steps if num_steps else None,
           "output_tokens_per_step": output_tokens / num_steps if num_steps else None,
           "fairness": stats.get("fairness"),  # the server's counters, cumulative over its runs
           "fair_preemptions": (stats.get("fairness") or {}).get("preemptions", 0) - preempted_before}
    for tenant in (LIGHT, HEAVY):
        mine = [r for t, r in results if t == tenant]
        ok = [r for r in mine if r.ok]
        out[tenant] = {"requests": len(mine), "failed": len(mine) - len(ok),
                       "ttft_ms": percentiles([r.ttft for r in ok]), "ttfts_ms": [1000 * r.ttft for r in ok],
                       "output_tokens": sum(r.output_tokens for r in mine)}
    return out


async def capacity(url: str, prompts: list[list[int]]) -> float:
    """Requests/s with every request sent at once."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=1200,
                                 limits=httpx.Limits(max_connections=len(prompts) + 8)) as http:
        started = time.perf_counter()
        results = await asyncio.gather(*(one(http, ids, None) for ids in prompts))
    return sum(r.ok for r in results) / (time.perf_counter() - started)


def start_server(model: str, port: int, max_num_seqs: int, log_path: Path) -> subprocess.Popen:
    from devstack.processes import python
    from devstack.services import wait_for_port

    env = {**os.environ, "ENGINE_API_KEY": API_KEY, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "wb")  # owned by the child for its lifetime
    proc = subprocess.Popen(python("-m", "engine", "serve", model, "--port", str(port), "--served-model-name",
                                   "bench", "--no-enable-lora", "--max-num-seqs", str(max_num_seqs),
                                   "--max-waiting", "4096"),
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port("127.0.0.1", port, 300, "engine server", proc)
    return proc


RUN_ORDER = ("alone", "fcfs", "fair")


def run_order(repeat: int) -> tuple[str, ...]:
    """The order of a repeat's three runs: as ``RUN_ORDER`` in even repeats, reversed in odd ones, so that a drift of
    the host over the benchmark (runs of the same work slowed 14% over three minutes on the 2-core Zen 4 VM) weighs on
    each kind alike in the pooled ratios of an even number of repeats; in a fixed order arrival order always ran
    after alone and before the keyed run."""
    return alternated(RUN_ORDER, repeat)


def alternated(order: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """``order`` in even repeats, reversed in odd ones."""
    return order if repeat % 2 == 0 else order[::-1]


def _pooled_rates(rs: list[dict]) -> tuple[float, float]:
    """Output tokens per second and per step over runs ``rs``, pooled: every run's tokens over all their seconds (their
    steps)."""
    tokens = [r["output_tok_s"] * r["duration_s"] for r in rs]
    steps = sum(r.get("steps") or t / r["output_tokens_per_step"] for r, t in zip(rs, tokens, strict=True))
    return sum(tokens) / sum(r["duration_s"] for r in rs), sum(tokens) / steps


def summarize(runs: dict[str, list[dict]]) -> tuple[dict, dict]:
    """The light tenant's TTFT percentiles over each kind's pooled runs (``runs``: "alone", "fair", "fcfs" -> the
    ``run`` results, alone and fair pairwise by repeat) and the ratios: p99 pooled with keys (and in arrival order)
    over alone, each repeat's own p99 ratio, and throughput with keys over arrival order, pooled over the runs of each
    (a run's output tokens over its seconds, and over its engine steps) and each repeat's own."""
    pooled = {name: percentiles([ms / 1000 for r in rs for ms in r[LIGHT]["ttfts_ms"]]) for name, rs in runs.items()}
    p99 = {name: pooled[name]["p99"] for name in pooled}
    (fair_tok_s, fair_per_step), (fcfs_tok_s, fcfs_per_step) = _pooled_rates(runs["fair"]), _pooled_rates(runs["fcfs"])
    ratios = {"light_p99_ttft_fair_over_alone": p99["fair"] / p99["alone"] if p99["alone"] else None,
              "light_p99_ttft_fcfs_over_alone": p99["fcfs"] / p99["alone"] if p99["alone"] else None,
              "light_p99_ttft_fair_over_alone_each_repeat": [
                  f[LIGHT]["ttft_ms"]["p99"] / a[LIGHT]["ttft_ms"]["p99"] if a[LIGHT]["ttft_ms"]["p99"] else None
                  for a, f in zip(runs["alone"], runs["fair"], strict=True)],
              "light_requests_pooled": {name: sum(len(r[LIGHT]["ttfts_ms"]) for r in rs) for name, rs in runs.items()},
              "throughput_fair_over_fcfs": fair_tok_s / fcfs_tok_s,
              "throughput_fair_over_fcfs_each_repeat": [f["output_tok_s"] / c["output_tok_s"]
                                                        for f, c in zip(runs["fair"], runs["fcfs"], strict=False)],
              "output_per_step_fair_over_fcfs": fair_per_step / fcfs_per_step}
    return pooled, ratios


def print_run(name: str, r: dict) -> None:
    print(f"{name:8}: light TTFT p50 {r[LIGHT]['ttft_ms']['p50']:.0f} ms p99 {r[LIGHT]['ttft_ms']['p99']:.0f} ms;"
          f" heavy failed {r[HEAVY]['failed']}; {r['output_tok_s']:.1f} tok/s;"
          f" mean step {r['mean_step_ms']:.1f} ms, {r['output_tokens_per_step']:.2f} output tokens a step;"
          f" fairness preemptions {r['fair_preemptions']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from engine.models.prepare import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 s of load instead of 90")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--port", type=int, default=8193)
    parser.add_argument("--repeats", type=int, default=1,
                        help="run alone and with keys this many times, interleaved, and pool the light TTFTs")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    seconds = args.seconds or (30.0 if args.quick else 90.0)
    model = str(resolve_model(args.model))
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rng = random.Random(0)
    server = start_server(model, args.port, args.max_num_seqs, RESULTS / f"fairness-{stamp}.log")
    url = f"http://127.0.0.1:{args.port}"
    try:
        asyncio.run(capacity(url, [prompt(rng) for _ in range(4)]))  # warm-up
        cap = asyncio.run(capacity(url, [prompt(rng) for _ in range(4 * args.max_num_seqs)]))
        light_rate = 1.5 * cap / 11

        def plan(repeat: int, seed: int, with_heavy: bool = True) -> list:
            """Repeat ``repeat``'s arrivals (the same in each of its runs), fresh prompts: no run reads another's
            prefix cache."""
            fresh = random.Random(seed + 100 * repeat)
            plan = [(t, LIGHT, prompt(fresh)) for t in arrivals(light_rate, seconds, seed=1 + 100 * repeat)]
            if with_heavy:
                plan += [(t, HEAVY, prompt(fresh)) for t in arrivals(10 * light_rate, seconds, seed=2 + 100 * repeat)]
            return sorted(plan, key=lambda item: item[0])

        print(f"capacity {cap:.2f} req/s; light {light_rate:.2f} req/s, heavy {10 * light_rate:.2f} req/s, "
              f"{seconds:.0f} s, {args.repeats} repeat(s)", flush=True)
        runs = {"alone": [], "fair": [], "fcfs": []}
        for repeat in range(args.repeats):
            for name in run_order(repeat):
                if name == "alone":
                    result = asyncio.run(run(url, plan(repeat, 10, with_heavy=False), keyed=True))
                else:
                    result = asyncio.run(run(url, plan(repeat, 11 if name == "fcfs" else 12), keyed=name == "fair"))
                runs[name].append(result)
                print_run(f"{name} {repeat + 1}", result)
        both = asyncio.run(backlogged(url, cap, seconds / 3, args.max_num_seqs, seed=13))
        print(f"backlogged: weights 1:2 served 1:{both['raw_service_ratio']:.2f} over {both['window_s']:.1f} s; "
              f"largest service gap {both['max_gap']:.0f} weighted tokens against VTC's bound {both['bound']:.0f}; "
              f"engine counters spread at most {both['engine_counter_spread_max']}; failed {both['failed']}",
              flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    pooled, ratios = summarize(runs)
    alone, fair, fcfs = runs["alone"][0], runs["fair"][0], runs["fcfs"][0]
    report = {"cpu": os.cpu_count(), "model": model, "seconds": seconds, "max_num_seqs": args.max_num_seqs,
              "capacity_req_s": cap, "light_rate": light_rate, "repeats": args.repeats, "alone": alone, "fair": fair,
              "fcfs": fcfs, "runs": runs, "backlogged": both, "light_ttft_pooled_ms": pooled, "ratios": ratios}
    path = RESULTS / f"fairness-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    for name in ("alone", "fair", "fcfs"):
        print(f"{name:5} pooled: light TTFT p50 {pooled[name]['p50']:.0f} ms p99 {pooled[name]['p99']:.0f} ms over "
              f"{ratios['light_requests_pooled'][name]} requests")
    print(json.dumps(ratios), flush=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
