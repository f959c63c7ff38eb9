"""The workload of :mod:`bench.fairness` replayed on the scheduler alone (no model, no server): how many steps the
light tenant's first token waits, free of the CPU noise the served benchmark carries on shared cores.

``python -m bench.fairness_steps [--steps N] [--seeds K] [--max-num-seqs N]``

The engine's own ``Scheduler``, ``BlockManager`` (prefix caching on) and ``FairAdmission``, stepped with a token
sampled whenever a sequence's prompt is computed: ``--max-num-seqs`` seats, a 2,048-token step budget, prompts of
64-128 random ids, 32 output tokens. A request holds its seat for 33 steps (its prefill, then 31 decodes; it
finishes on the step that samples its 32nd token), so capacity is ``seats / 33`` requests a step; the light key
arrives at 1/11 of 150% of that and the heavy key at 10x the light one (Poisson, in steps). Per seed: the light
key's wait from its arrival to the step that samples its first token (1 step at best: the step that computes its
prompt) alone, with both keys, and with both unkeyed (arrival order); the tokens of the step in flight when a light
request arrives (its wait for that step, which the prompt ration bounds while keys compete); the fairness
preemptions, and the output tokens per step with and without keys (a preempted sequence recomputes only what the
prefix cache lost; the steps a favoured key has to itself lower it by ~5% with keys without costing as much time:
such a step computes the light prompt alone, and the decodes it leaves out run in the next).
Results: ``bench/results/fairness-steps-<time>.json``.
"""

import argparse
import itertools
import json
import random
import time

import numpy as np

from bench.throughput import RESULTS
from engine.block_manager import BlockManager
from engine.fair_share import FairShare
from engine.fairness import FairAdmission
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

OUTPUT_TOKENS = 32
STEPS_PER_REQUEST = OUTPUT_TOKENS + 1
LIGHT, HEAVY = "tenant-light", "tenant-heavy"


def light_rate_per_step(max_num_seqs: int) -> float:
    """The light key's arrivals a step: 1/11 of 150% of the batch's capacity of ``max_num_seqs / 33`` requests a step
    (the heavy key sends 10x that)."""
    return 1.5 * max_num_seqs / STEPS_PER_REQUEST / 11


def replay(seed: int, steps: int, max_num_seqs: int, *, keyed: bool, with_heavy: bool) -> dict:
    """One run: the light key's first-token waits in steps, the fairness preemptions, output tokens a step."""
    scheduler = Scheduler(BlockManager(8192, 16, True), max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                          admission=FairAdmission())
    light_rate = light_rate_per_step(max_num_seqs)
    rates = {LIGHT: light_rate, HEAVY: 10 * light_rate} if with_heavy else {LIGHT: light_rate}
    rngs = {tenant: random.Random(f"{seed}-{tenant}") for tenant in rates}  # the light key's arrivals: every run's
    due = {tenant: rngs[tenant].expovariate(rate) for tenant, rate in rates.items()}
    ids = itertools.count()
    arrived: dict[str, int] = {}
    waits: list[int] = []
    first_step_tokens: list[int] = []  # tokens computed by the step that samples a light request's first token
    arrival_step_tokens: list[int] = []  # tokens of the step running when a light request arrives (its wait for it)
    last_step_tokens = 0
    sampled_tokens = 0
    for step in range(steps):
        for tenant, rate in rates.items():
            while due[tenant] <= step:
                i = next(ids)
                rng = rngs[tenant]
                prompt = [rng.randrange(100, 40000) for _ in range(rng.randint(64, 128))]
                seq = Sequence(i, f"{tenant}-{i}", prompt, SamplingParams(max_tokens=OUTPUT_TOKENS), arrival_index=i)
                seq.fair_share = FairShare.of(tenant if keyed else None, 1.0, None)
                scheduler.add(seq)
                arrived[seq.request_id] = step
                if tenant == LIGHT:
                    arrival_step_tokens.append(last_step_tokens)
                due[tenant] += rng.expovariate(rate)
        out = scheduler.schedule()
        sampled = [7 if seq.num_computed_tokens + n >= seq.num_tokens else None
                   for seq, n in zip(out.seqs, out.num_new_tokens, strict=True)]
        scheduler.update(out, sampled)
        last_step_tokens = out.num_batched_tokens
        sampled_tokens += sum(token is not None for token in sampled)
        for seq, token in zip(out.seqs, sampled, strict=True):
            if token is not None and seq.num_output_tokens == 1 and seq.request_id.startswith(LIGHT):
                waits.append(step + 1 - arrived[seq.request_id])
                first_step_tokens.append(out.num_batched_tokens)
        scheduler.finish([seq for seq in out.seqs if seq.num_output_tokens >= OUTPUT_TOKENS], "length")
    return {"light_requests": len(waits), "light_wait_steps": _percentiles(waits),
            "light_first_step_tokens": _percentiles(first_step_tokens),
            "light_arrival_step_tokens": _percentiles(arrival_step_tokens),
            "fair_preemptions": scheduler.admission.num_fair_preemptions,
            "output_tokens_per_step": sampled_tokens / steps}


def _percentiles(values: list[int]) -> dict:
    array = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(array, 50)), "p90": float(np.percentile(array, 90)),
            "p99": float(np.percentile(array, 99)), "max": float(array.max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args(argv)
    runs = []
    for seed in range(args.seeds):
        run = {"seed": seed}
        for name, keyed, with_heavy in (("alone", True, False), ("fair", True, True), ("fcfs", False, True)):
            run[name] = replay(seed, args.steps, args.max_num_seqs, keyed=keyed, with_heavy=with_heavy)
            result, waits = run[name], run[name]["light_wait_steps"]
            print(f"seed {seed} {name:5}: light wait p50 {waits['p50']:.0f} p99 {waits['p99']:.1f} max "
                  f"{waits['max']:.0f} steps ({result['light_requests']} requests), its first-token step "
                  f"p50 {result['light_first_step_tokens']['p50']:.0f} p99 "
                  f"{result['light_first_step_tokens']['p99']:.0f} tokens, the step it arrives during p50 "
                  f"{result['light_arrival_step_tokens']['p50']:.0f} p99 "
                  f"{result['light_arrival_step_tokens']['p99']:.0f} tokens; fairness preemptions "
                  f"{result['fair_preemptions']}; {result['output_tokens_per_step']:.2f} output tokens/step",
                  flush=True)
        runs.append(run)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fairness-steps-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"steps": args.steps, "max_num_seqs": args.max_num_seqs, "runs": runs}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
