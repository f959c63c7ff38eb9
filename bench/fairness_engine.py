"""What fairness keys cost in throughput, on the real model in one process: the arrivals of :mod:`bench.fairness`,
counted in engine steps (as :mod:`bench.fairness_steps` counts them), driven through ``LLMEngine.step`` with keys and
without, the very same requests each way.

``python -m bench.fairness_engine [--model NAME_OR_PATH] [--steps N] [--pairs P] [--max-num-seqs N]``

The served benchmark's throughput ratio (keys against arrival order) carries the load client, HTTP streaming and
wall-clock arrivals on the same two cores, and one run's throughput there moves by a few percent with the host. Here
there is only the engine: ``--steps`` steps of Poisson arrivals in steps (the light key at 1/11 of 150% of the
batch's capacity of ``seats / 33`` requests a step, the heavy key at 10x that; prompts of 64-128 random ids, 32
greedy output tokens, EOS ignored), then drained. Each pair of rounds runs the same requests with keys and without,
in ABBA order over pairs (a drifting host weighs on both alike), each round under its own ``cache_salt`` so no round
reads another's prefix cache. Per round: wall seconds, engine steps, mean step time, output tokens a second and a
step; pooled: the wall-clock throughput with keys over arrival order (every round did the same work, so this is the
inverse ratio of their total seconds) and per step. Results: ``bench/results/fairness-engine-<time>.json``; the last
line printed is the pooled ratios.
"""

import argparse
import json
import random
import time

from bench.fairness import alternated
from bench.fairness_steps import HEAVY, LIGHT, OUTPUT_TOKENS, light_rate_per_step
from bench.throughput import RESULTS


def requests(steps: int, max_num_seqs: int, seed: int) -> list[tuple[int, str, list[int]]]:
    """(arrival step, tenant, prompt) in arrival order."""
    light_rate = light_rate_per_step(max_num_seqs)
    out = []
    for tenant, rate in ((LIGHT, light_rate), (HEAVY, 10 * light_rate)):
        rng = random.Random(f"{seed}-{tenant}")
        at = rng.expovariate(rate)
        while at < steps:
            out.append((int(at), tenant, [rng.randrange(100, 40000) for _ in range(rng.randint(64, 128))]))
            at += rng.expovariate(rate)
    return sorted(out, key=lambda item: item[0])


def round_order(pair: int) -> tuple[str, str]:
    """ABBA: keyed first in even pairs, arrival order first in odd ones."""
    return alternated(("keyed", "fcfs"), pair)


def run_round(engine, plan: list[tuple[int, str, list[int]]], keyed: bool, salt: str) -> dict:
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    fairness = engine.stats().get("fairness") or {}
    preemptions_before, own_before = fairness.get("preemptions", 0), fairness.get("own_steps", 0)
    started, step, index, output_tokens = time.perf_counter(), 0, 0, 0
    while index < len(plan) or engine.has_unfinished_requests():
        while index < len(plan) and plan[index][0] <= step:
            _, tenant, prompt = plan[index]
            engine.add_request(f"{salt}-{index}", prompt_token_ids=prompt, params=params,
                               fairness_key=tenant if keyed else None, cache_salt=salt)
            index += 1
        output_tokens += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
        step += 1
    seconds = time.perf_counter() - started
    fairness = engine.stats().get("fairness") or {}
    return {"keyed": keyed, "seconds": seconds, "steps": step, "mean_step_ms": 1000 * seconds / step,
            "output_tokens": output_tokens, "output_tok_s": output_tokens / seconds,
            "output_tokens_per_step": output_tokens / step,
            "fair_preemptions": fairness.get("preemptions", 0) - preemptions_before,
            "own_steps": fairness.get("own_steps", 0) - own_before}


def pooled(rounds: list[dict]) -> dict:
    """Keys over arrival order: output tokens a second over all seconds of each kind, and a step."""
    kinds = {kind: [r for r in rounds if r["keyed"] == (kind == "keyed")] for kind in ("keyed", "fcfs")}
    rate = {kind: sum(r["output_tokens"] for r in rs) / sum(r["seconds"] for r in rs) for kind, rs in kinds.items()}
    per_step = {kind: sum(r["output_tokens"] for r in rs) / sum(r["steps"] for r in rs) for kind, rs in kinds.items()}
    return {"throughput_keyed_over_fcfs": rate["keyed"] / rate["fcfs"],
            "per_step_keyed_over_fcfs": per_step["keyed"] / per_step["fcfs"],
            "output_tok_s": rate, "output_tokens_per_step": per_step}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=300, help="steps of arrivals in a round (then drained)")
    parser.add_argument("--pairs", type=int, default=4, help="pairs of rounds, keys and arrival order (use an even P)")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.pairs < 1:
        parser.error("--steps and --pairs must be at least 1")

    from engine import LLM
    from engine.models.prepare import resolve_model

    model = str(resolve_model(args.model))
    engine = LLM(model=model, max_num_seqs=args.max_num_seqs).llm_engine
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_round(engine, requests(40, args.max_num_seqs, seed=-1), keyed=True, salt="warm-up")
    rounds = []
    for pair in range(args.pairs):
        plan = requests(args.steps, args.max_num_seqs, seed=pair)
        for kind in round_order(pair):
            result = run_round(engine, plan, keyed=kind == "keyed", salt=f"pair{pair}-{kind}")
            rounds.append({"pair": pair, **result})
            print(f"pair {pair} {kind:5}: {result['seconds']:.1f} s, {result['steps']} steps of "
                  f"{result['mean_step_ms']:.1f} ms, {result['output_tok_s']:.1f} tok/s, "
                  f"{result['output_tokens_per_step']:.2f} tokens a step, {result['fair_preemptions']} fairness "
                  f"preemptions, {result['own_steps']} own steps", flush=True)
    ratios = pooled(rounds)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fairness-engine-{stamp}.json"
    path.write_text(json.dumps({"model": model, "steps": args.steps, "pairs": args.pairs,
                                "max_num_seqs": args.max_num_seqs, "rounds": rounds, "ratios": ratios}, indent=2))
    print(f"wrote {path}")
    print(json.dumps({k: round(v, 4) for k, v in ratios.items() if isinstance(v, float)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
