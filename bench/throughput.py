"""Offline throughput: this engine vs transformers on one workload, and the engine against its roofline.

``python -m bench.throughput [--quick] [--model NAME_OR_PATH] [--threads N]``

Workload: 64 requests, prompt lengths uniform in 16..256 tokens, 128 output tokens each, greedy, EOS ignored
(``--quick``: 32 requests, 64 output tokens). Measured in the same run on the same machine:
  * this engine (``LLM.generate``, continuous batching, defaults);
  * transformers ``generate`` with static batching (left-padded batches) at several batch sizes, the best
    one reported, and one request at a time on a subset of 8 (4 with ``--quick``);
  * the roofline of the engine's own schedule: for every step it ran, the time of the weight GEMMs at that
    step's token count (and of the vocabulary projection at its sampled rows), timed here with the model's
    own weights, plus the KV bytes the step's attention must read divided by the memory bandwidth measured
    here (sum of a 1 GiB tensor).
Results go to ``bench/results/throughput-<time>.json`` and ``.png``; the last lines printed are the ratios.
"""

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Workload:
    num_requests: int
    min_prompt: int
    max_prompt: int
    output_tokens: int
    sequential_subset: int
    static_batch_sizes: list[int]
    prompts: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def num_output_tokens(self) -> int:
        return self.num_requests * self.output_tokens


def make_workload(quick: bool, vocab_size: int, seed: int = 0) -> Workload:
    workload = Workload(32, 16, 256, 64, 4, [32]) if quick else Workload(64, 16, 256, 128, 8, [16, 32, 64])
    rng = random.Random(seed)
    # Ordinary tokens only (ids below 100 are mostly special and byte tokens in SmolLM2's vocabulary).
    workload.prompts = [
        [rng.randrange(100, vocab_size) for _ in range(rng.randint(workload.min_prompt, workload.max_prompt))]
        for _ in range(workload.num_requests)
    ]
    return workload


@dataclass
class StepRecord:
    num_tokens: int  # rows of every weight GEMM this step
    num_sampled: int  # rows of the vocabulary projection
    context_tokens: int  # sum of the scheduled sequences' context lengths: the KV attention reads


def run_engine(model: str, workload: Workload) -> tuple[float, list[StepRecord], object]:
    from engine import LLM, SamplingParams

    llm = LLM(model, seed=0)
    params = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    llm.generate(workload.prompts[:4], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    steps: list[StepRecord] = []
    scheduler = llm.llm_engine.scheduler
    schedule = scheduler.schedule

    def recording_schedule():
        out = schedule()
        ends = [s.num_computed_tokens + n for s, n in zip(out.seqs, out.num_new_tokens, strict=True)]
        sampled = sum(1 for s, end in zip(out.seqs, ends, strict=True) if end == s.num_tokens)
        steps.append(StepRecord(out.num_batched_tokens, sampled, sum(ends)))
        return out

    scheduler.schedule = recording_schedule
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    scheduler.schedule = schedule
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == workload.num_output_tokens, f"engine produced {produced} tokens"
    return elapsed, [s for s in steps if s.num_tokens], llm


def run_transformers_static(folder: Path, workload: Workload, batch_size: int) -> float:
    model, pad_id = _hf_model(folder)
    start = time.perf_counter()
    for first in range(0, workload.num_requests, batch_size):
        batch = workload.prompts[first : first + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=workload.output_tokens,
                                 min_new_tokens=workload.output_tokens, do_sample=False, pad_token_id=pad_id)
        assert out.shape[1] - width == workload.output_tokens
    return time.perf_counter() - start


def run_transformers_sequential(folder: Path, workload: Workload) -> float:
    model, pad_id = _hf_model(folder)
    start = time.perf_counter()
    for prompt in workload.prompts[: workload.sequential_subset]:
        with torch.no_grad():
            model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=workload.output_tokens, min_new_tokens=workload.output_tokens,
                           do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - start


_HF_MODELS: dict = {}


def _hf_model(folder: Path):
    if folder not in _HF_MODELS:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        pad = model.generation_config.pad_token_id
        _HF_MODELS[folder] = (model, pad if pad is not None else 0)
    return _HF_MODELS[folder]


# ---- roofline
def memory_bandwidth(num_bytes: int = 2**30, repeats: int = 5) -> float:
    """Bytes/s of reading a 1 GiB tensor (best of ``repeats``), what attention's KV reads run into."""
    data = torch.ones(num_bytes // 4)
    best = min(_timed(lambda: data.sum()) for _ in range(repeats))
    return num_bytes / best


def gemm_seconds(llm, num_tokens: int, num_sampled: int, repeats: int = 3) -> float:
    """Weight GEMMs of one step with the engine's own weights: every projection at ``num_tokens`` rows,
    the vocabulary projection at ``num_sampled`` rows."""
    from engine.models.linear import Projection

    model = llm.llm_engine.model_runner.model
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    inputs = {p.in_features: torch.randn(num_tokens, p.in_features) for p in projections}
    head_input = torch.randn(max(num_sampled, 1), model.config.hidden_size)

    def run():
        for p in projections:
            F.linear(inputs[p.in_features], p.weight, p.bias)
        if num_sampled:
            F.linear(head_input, model.lm_head)

    run()
    return min(_timed(run) for _ in range(repeats))


def roofline(llm, steps: list[StepRecord], bandwidth: float) -> dict:
    config = llm.llm_engine.model_config
    kv_bytes_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    timings: dict[tuple[int, int], float] = {}
    for step in steps:
        key = (step.num_tokens, step.num_sampled)
        if key not in timings:
            timings[key] = gemm_seconds(llm, *key)
    gemm = sum(timings[(s.num_tokens, s.num_sampled)] for s in steps)
    kv_bytes = sum(s.context_tokens for s in steps) * kv_bytes_per_token
    return {"gemm_s": gemm, "attention_kv_s": kv_bytes / bandwidth, "total_s": gemm + kv_bytes / bandwidth,
            "kv_gib_read": kv_bytes / 2**30, "distinct_step_shapes": len(timings)}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- report
def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, values = ["transformers\nsequential"], [report["transformers"]["sequential_tok_s"]]
    for size, rate in report["transformers"]["static_tok_s"].items():
        names.append(f"transformers\nstatic bs={size}")
        values.append(rate)
    names += ["engine", "roofline"]
    values += [report["engine"]["tok_s"], report["engine"]["roofline_tok_s"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(names, values, color=["#bbb"] * (len(names) - 2) + ["#2a6fdb", "#9cc3f5"])
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens / s")
    w = report["workload"]
    ax.set_title(f"{report['model']}: {w['num_requests']} requests, prompts {w['min_prompt']}-{w['max_prompt']}, "
                 f"{w['output_tokens']} output tokens, {report['machine']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workload, one static batch size (< 3 min)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from engine.llm_engine import resolve_model_folder

    folder = resolve_model_folder(args.model)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.quick, vocab)
    engine_s, steps, llm = run_engine(args.model, workload)
    bandwidth = memory_bandwidth()
    bound = roofline(llm, steps, bandwidth)
    static = {size: workload.num_output_tokens / run_transformers_static(folder, workload, size)
              for size in workload.static_batch_sizes}
    sequential = workload.sequential_subset * workload.output_tokens / run_transformers_sequential(folder, workload)

    engine_tok_s = workload.num_output_tokens / engine_s
    best_size = max(static, key=static.get)
    report = {
        "model": args.model,
        "machine": {"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                    "bandwidth_gb_s": bandwidth / 1e9},
        "workload": {k: v for k, v in asdict(workload).items() if k != "prompts"},
        "engine": {"seconds": engine_s, "tok_s": engine_tok_s, "steps": len(steps),
                   "roofline": bound, "roofline_tok_s": workload.num_output_tokens / bound["total_s"],
                   "fraction_of_roofline": bound["total_s"] / engine_s,
                   "stats": llm.llm_engine.stats()},
        "transformers": {"static_tok_s": static, "best_static_batch_size": best_size,
                         "sequential_tok_s": sequential},
        "ratios": {"vs_best_static": engine_tok_s / static[best_size], "vs_sequential": engine_tok_s / sequential},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"throughput-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str))
    plot(report, stem.with_suffix(".png"))
    print(f"results: {stem}.json / .png (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s; roofline {bound['total_s']:.2f} s "
          f"(GEMMs {bound['gemm_s']:.2f} s + KV reads {bound['attention_kv_s']:.2f} s); engine {engine_s:.2f} s")
    print(f"transformers sequential: {sequential:.1f} tok/s")
    for size, rate in static.items():
        print(f"transformers static batch {size}: {rate:.1f} tok/s")
    print(f"engine: {engine_tok_s:.1f} tok/s ({len(steps)} steps)")
    print(f"engine / roofline: {report['engine']['fraction_of_roofline']:.1%}")
    print(f"engine / transformers best static (bs={best_size}): {report['ratios']['vs_best_static']:.2f}x")
    print(f"engine / transformers sequential: {report['ratios']['vs_sequential']:.2f}x")
    return report


if __name__ == "__main__":
    main()
