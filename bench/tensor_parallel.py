"""Tensor parallelism: one rank against two on this machine, with the cost of the collectives on record.

``python -m bench.tensor_parallel [--quick] [--model NAME_OR_PATH] [--dtype D] [--rounds N]``

Measured in one run, TP=1 and TP=2 taking turns (``--rounds`` each, best kept), on SmolLM2-135M by default:
  * offline throughput: the workload of ``bench.throughput`` (64 requests, prompts of 16-256 tokens, 128 output
    tokens, greedy; ``--quick``: 32 requests, 64 output), output tokens per second;
  * one stream: the median time of a decode step (TPOT) of one request (128 prompt tokens, 64 output);
  * inside the engine, per step: rank 0's time in the step broadcast, the all-reduces (2 per layer) and the logits
    gather. A collective's time on rank 0 includes waiting for the other rank to reach it (load imbalance);
  * the collectives alone, between two processes in step (a barrier before each timed call): gloo all-reduce of
    ``[M, hidden]`` activations at M = 1..2048 tokens, the broadcast of the step message at its capacities, the
    gather of ``[M, vocab / 2]`` logits: the cost model's terms.
TP=1 runs with every CPU's thread, each TP=2 rank with half (the engine's default). Greedy outputs of the two are
compared token by token (identical in fp32; in bf16 the all-reduce's rounding may flip near-ties: the agreement
rate is reported). Results: ``bench/results/tensor_parallel-<time>.json``; the last lines printed are the figures.
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bench.throughput import make_workload

RESULTS = Path(__file__).resolve().parent / "results"
_TOKENS = (1, 16, 64, 256, 2048)
_CAPACITIES = (1024, 16384)


def run_engine(model: str, size: int, workload, dtype: str) -> dict:
    """Throughput, one-stream TPOT and per-step collective times of one engine."""
    from engine import LLM, SamplingParams

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    started = time.perf_counter()
    llm = LLM(model, dtype=dtype, seed=0, tensor_parallel_size=size)
    start_s = time.perf_counter() - started
    engine = llm.llm_engine
    greedy = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    llm.generate(
        [list(reversed(p)) for p in workload.prompts[:4]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False
    )
    before = _parallel(engine)
    elapsed = time.perf_counter()
    outputs = llm.generate(workload.prompts, greedy, use_tqdm=False)
    elapsed = time.perf_counter() - elapsed
    after = _parallel(engine)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    tpot = one_stream_tpot(llm, (workload.prompts[0] * 8)[:128])
    result = {
        "tensor_parallel_size": size,
        "threads_per_rank": max(1, threads // size),
        "start_s": round(start_s, 1),
        "dtype": engine.stats()["gemm"]["dtype"],
        "tok_s": round(produced / elapsed, 1),
        "seconds": elapsed,
        "tpot_ms": tpot,
        "tokens": [o.outputs[0].token_ids for o in outputs],
        "per_step": _per_step(before, after),
    }
    llm.shutdown()
    return result


def one_stream_tpot(llm, prompt: list[int], output_tokens: int = 64) -> float:
    """Median wall time of the decode steps of one request (its prefill step left out)."""
    from engine import SamplingParams

    engine, times = llm.llm_engine, []
    step = engine.step

    def timed_step():
        start = time.perf_counter()
        outputs = step()
        times.append(time.perf_counter() - start)
        return outputs

    engine.step = timed_step
    try:
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True), use_tqdm=False)
    finally:
        engine.step = step
    return round(1e3 * statistics.median(times[1:]), 2)


def _parallel(engine) -> dict:
    stats = engine.stats()
    return {**(stats["tensor_parallel"] or {}), "steps": stats["steps"]}


def _per_step(before: dict, after: dict) -> dict | None:
    steps = after["steps"] - before["steps"]
    if "size" not in after or not steps:
        return None
    per = {
        f"{name}_ms": round((after[f"{name}_ms"] - before[f"{name}_ms"]) / steps, 3)
        for name in ("broadcast", "all_reduce", "gather")
    }
    per["broadcast_kib"] = round((after["broadcast_bytes"] - before["broadcast_bytes"]) / steps / 1024, 1)
    per["all_reduces"] = (after["all_reduces"] - before["all_reduces"]) / steps
    return {"steps": steps, **per}


# ---- the collectives alone
def collective_costs(hidden: int, vocab: int, dtype: torch.dtype) -> dict:
    """Two gloo processes in step: median microseconds of each collective (rank 0's clock)."""
    import torch.multiprocessing as mp

    from engine.distributed.workers import _free_port

    port, queue = _free_port(), mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_collectives, args=(port, hidden, vocab, dtype, queue), nprocs=2, start_method="spawn")
    return queue.get()


def _collectives(rank: int, port: int, hidden: int, vocab: int, dtype: torch.dtype, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def median_us(fn, repeats: int = 30) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return round(1e6 * statistics.median(times), 1)

    result = {"all_reduce_us": {}, "gather_logits_us": {}, "broadcast_us": {}}
    for m in _TOKENS:
        x = torch.ones(m, hidden, dtype=dtype)
        result["all_reduce_us"][m] = median_us(lambda x=x: dist.all_reduce(x))
        logits = torch.ones(min(m, 256), vocab // 2)
        parts = [torch.empty_like(logits) for _ in range(2)] if rank == 0 else None
        result["gather_logits_us"][min(m, 256)] = median_us(lambda lg=logits, p=parts: dist.gather(lg, p, dst=0))
    for capacity in _CAPACITIES:
        buffer = torch.zeros(capacity, dtype=torch.int64)
        result["broadcast_us"][capacity] = median_us(lambda b=buffer: dist.broadcast(b, src=0))
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smaller workload, one round")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--rounds", type=int, default=None, help="turns of each size (default 2, quick 1)")
    args = parser.parse_args(argv)
    from engine.config import EngineConfig, ModelConfig
    from engine.llm_engine import resolve_model_folder

    config = ModelConfig.from_folder(resolve_model_folder(args.model))
    workload = make_workload(args.quick, config.vocab_size)
    load_start, runs = os.getloadavg(), {1: [], 2: []}
    for _ in range(args.rounds or (1 if args.quick else 2)):
        for size in (1, 2):
            runs[size].append(run_engine(args.model, size, workload, args.dtype))
            print(
                f"TP={size}: {runs[size][-1]['tok_s']} tok/s, TPOT {runs[size][-1]['tpot_ms']} ms, "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    dtype = EngineConfig(model=args.model, dtype=args.dtype).torch_dtype(config)
    costs = collective_costs(config.hidden_size, config.vocab_size, dtype)
    report = summarize(args, workload, runs, costs, load_start)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"tensor_parallel-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(report, indent=2))
    print_report(report, path)
    return report


def summarize(args, workload, runs: dict, costs: dict, load_start) -> dict:
    best = {size: max(results, key=lambda r: r["tok_s"]) for size, results in runs.items()}
    one, two = best[1]["tokens"], best[2]["tokens"]
    same = sum(a == b for a, b in zip(one, two, strict=True))
    agree = sum(x == y for a, b in zip(one, two, strict=True) for x, y in zip(a, b, strict=True))
    for results in runs.values():
        for r in results:
            r.pop("tokens")
    return {
        "model": args.model,
        "quick": args.quick,
        "workload": {
            "num_requests": workload.num_requests,
            "prompt_tokens": [workload.min_prompt, workload.max_prompt],
            "output_tokens": workload.output_tokens,
        },
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "torch": torch.__version__,
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg(),
        },
        "runs": {str(size): results for size, results in runs.items()},
        "best": {str(size): {k: r[k] for k in ("tok_s", "tpot_ms", "per_step", "dtype")} for size, r in best.items()},
        "speedup_tok_s": round(best[2]["tok_s"] / best[1]["tok_s"], 3),
        "tpot_ratio": round(best[2]["tpot_ms"] / best[1]["tpot_ms"], 3),
        "identical_outputs": f"{same}/{len(one)}",
        "token_agreement": round(agree / sum(map(len, one)), 4),
        "collectives_alone": costs,
    }


def print_report(report: dict, path: Path) -> None:
    print(json.dumps({k: report[k] for k in ("best", "collectives_alone", "machine")}, indent=1))
    print(f"written: {path}")
    print(
        f"TP=2 / TP=1: throughput x{report['speedup_tok_s']}, one-stream TPOT x{report['tpot_ratio']}; "
        f"identical outputs {report['identical_outputs']}, token agreement {report['token_agreement']}"
    )


if __name__ == "__main__":
    main()
