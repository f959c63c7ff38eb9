"""Offline throughput: this engine vs transformers on one workload, and the engine against its roofline.

``python -m bench.throughput [--quick] [--model NAME_OR_PATH] [--threads N] [--dtype D] [--gemm PATH]``

Workload: 64 requests, prompt lengths uniform in 16..256 tokens, 128 output tokens each, greedy, EOS ignored
(``--quick``: 32 requests, 64 output tokens). Measured in the same run on the same machine:
  * this engine (``LLM.generate``, continuous batching, defaults but ``--dtype`` and ``--gemm``);
  * transformers ``generate`` in the engine's dtype, with static batching (left-padded batches) at several batch
    sizes, the best one reported, and one request at a time on a subset of 8 (4 with ``--quick``);
  * the roofline of the engine's own schedule: for every step it ran, the time of the weight GEMMs at that
    step's token count (and of the vocabulary projection at its sampled rows), timed here with the model's
    own weights through the GEMM paths the engine chose, plus the KV bytes the step's attention must read at the
    memory bandwidth measured here (the time to sum a 1 GiB tensor).
Every time is taken both by the wall clock and as process CPU time: on a machine shared with other work, run
``--threads 1`` and read the CPU-time ratios (2-thread OpenMP regions stall whenever another process holds a
core, and wall time counts that). Results go to ``bench/results/throughput-<time>.json`` and ``.png``; the last
lines printed are the ratios.
"""

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

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
    seconds: "Seconds | None" = None  # the step's forward pass and sampling


@dataclass
class Seconds:
    """Wall-clock and process CPU time. On a shared machine run with ``--threads 1`` and compare CPU times:
    they do not count the time other processes hold the cores (2-thread OpenMP regions stall on a busy core)."""

    wall: float
    cpu: float

    def __add__(self, other: "Seconds") -> "Seconds":
        return Seconds(self.wall + other.wall, self.cpu + other.cpu)


def timed(fn) -> Seconds:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Seconds(time.perf_counter() - wall, time.process_time() - cpu)


def best_of(fn, repeats: int) -> Seconds:
    runs = [timed(fn) for _ in range(repeats)]
    return Seconds(min(r.wall for r in runs), min(r.cpu for r in runs))


def run_engine(model: str, workload: Workload, **engine_options) -> tuple[Seconds, list[StepRecord], object]:
    from engine import LLM, SamplingParams

    llm = LLM(model, seed=0, **engine_options)
    params = SamplingParams(temperature=0, max_tokens=workload.output_tokens, ignore_eos=True)
    warmup = [list(reversed(p)) for p in workload.prompts[:4]]  # no prefix-cache hits for the measured run
    llm.generate(warmup, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    steps: list[StepRecord] = []
    engine = llm.llm_engine
    schedule, execute = engine.scheduler.schedule, engine.model_runner.execute

    def recording_schedule():
        out = schedule()
        ends = [s.num_computed_tokens + n for s, n in zip(out.seqs, out.num_new_tokens, strict=True)]
        sampled = sum(1 for s, end in zip(out.seqs, ends, strict=True) if end == s.num_tokens)
        steps.append(StepRecord(out.num_batched_tokens, sampled, sum(ends)))
        return out

    def recording_execute(out):
        result = []
        steps[-1].seconds = timed(lambda: result.append(execute(out)))
        return result[0]

    engine.scheduler.schedule, engine.model_runner.execute = recording_schedule, recording_execute
    outputs = []
    elapsed = timed(lambda: outputs.extend(llm.generate(workload.prompts, params, use_tqdm=True)))
    engine.scheduler.schedule, engine.model_runner.execute = schedule, execute
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == workload.num_output_tokens, f"engine produced {produced} tokens"
    assert engine.stats()["prefix_cache_hit_rate"] == 0.0 or engine.block_manager.num_hit_tokens == 0
    return elapsed, [s for s in steps if s.num_tokens], llm


def run_transformers_static(folder: Path, workload: Workload, batch_size: int, dtype: torch.dtype) -> Seconds:
    model, pad_id = _hf_model(folder, dtype)
    return timed(lambda: _static_batches(model, pad_id, workload, batch_size))


def _static_batches(model, pad_id: int, workload: Workload, batch_size: int) -> None:
    for first in range(0, workload.num_requests, batch_size):
        batch = workload.prompts[first : first + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=workload.output_tokens,
                                 min_new_tokens=workload.output_tokens, do_sample=False, pad_token_id=pad_id)
        assert out.shape[1] - width == workload.output_tokens


def run_transformers_sequential(folder: Path, workload: Workload, dtype: torch.dtype) -> Seconds:
    model, pad_id = _hf_model(folder, dtype)

    def run():
        for prompt in workload.prompts[: workload.sequential_subset]:
            with torch.no_grad():
                model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=workload.output_tokens, min_new_tokens=workload.output_tokens,
                               do_sample=False, pad_token_id=pad_id)

    return timed(run)


_HF_MODELS: dict = {}


def _hf_model(folder: Path, dtype: torch.dtype):
    if (folder, dtype) not in _HF_MODELS:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        pad = model.generation_config.pad_token_id
        _HF_MODELS[folder, dtype] = (model, pad if pad is not None else 0)
    return _HF_MODELS[folder, dtype]


# ---- roofline
def memory_bandwidth(num_bytes: int = 2**30, repeats: int = 5) -> Seconds:
    """Seconds to read a 1 GiB tensor (best of ``repeats``): what attention's KV reads run into."""
    data = torch.ones(num_bytes // 4)
    return best_of(lambda: data.sum(), repeats)


def projection_seconds(llm, num_tokens: int) -> Seconds:
    """Every projection of the decoder layers (q/k/v, o, gate/up, down) at ``num_tokens`` rows, with the
    engine's own weights and GEMM paths."""
    from engine.models.linear import Projection

    runner = llm.llm_engine.model_runner
    projections = [m for m in runner.model.layers.modules() if isinstance(m, Projection)]
    inputs = {p.in_features: torch.randn(num_tokens, p.in_features).to(runner.dtype) for p in projections}

    def run():
        for p in projections:
            p(inputs[p.in_features])

    return _best_after_warmup(run, num_tokens)


def vocabulary_seconds(llm, num_rows: int) -> Seconds:
    """The projection to the vocabulary at ``num_rows`` rows (the sampled tokens of a step)."""
    if num_rows == 0:
        return Seconds(0.0, 0.0)
    runner = llm.llm_engine.model_runner
    hidden = torch.randn(num_rows, runner.model.config.hidden_size).to(runner.dtype)
    return _best_after_warmup(lambda: runner.model.lm_head(hidden), num_rows)


def _best_after_warmup(fn, rows: int) -> Seconds:
    if rows > 512:  # seconds-long and steady: one run is enough
        return timed(fn)
    fn()
    return best_of(fn, 3)


def roofline(llm, steps: list[StepRecord], read_gib: Seconds) -> dict:
    """GEMM time of every step the engine ran plus its KV reads at the measured bandwidth, wall and CPU."""
    config = llm.llm_engine.model_config
    kv_bytes_per_token = (2 * config.num_layers * config.num_kv_heads * config.head_dim
                          * llm.llm_engine.model_runner.kv_cache.element_size())
    projections = {t: projection_seconds(llm, t) for t in sorted({s.num_tokens for s in steps})}
    vocabulary = {r: vocabulary_seconds(llm, r) for r in sorted({s.num_sampled for s in steps})}

    def gemm(step: StepRecord) -> Seconds:
        return projections[step.num_tokens] + vocabulary[step.num_sampled]

    zero = Seconds(0.0, 0.0)
    gemm_total = sum((gemm(s) for s in steps), zero)
    kv_gib = sum(s.context_tokens for s in steps) * kv_bytes_per_token / 2**30
    kv = Seconds(kv_gib * read_gib.wall, kv_gib * read_gib.cpu)
    decode = [s for s in steps if s.num_tokens == s.num_sampled]
    return {"gemm": gemm_total, "kv_reads": kv, "total": gemm_total + kv, "kv_gib_read": kv_gib,
            "distinct_step_shapes": len(projections) + len(vocabulary),
            "decode_steps": {"count": len(decode), "engine": sum((s.seconds for s in decode), zero),
                             "gemm": sum((gemm(s) for s in decode), zero)}}


# ---- report
def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates, sizes = report["tok_s"]["wall"], report["static_batch_sizes"]
    names = ["transformers\nsequential", *(f"transformers\nstatic bs={b}" for b in sizes), "engine", "roofline"]
    values = [rates["transformers_sequential"], *(rates[f"transformers_static_{b}"] for b in sizes),
              rates["engine"], rates["roofline"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(names, values, color=["#bbb"] * (len(names) - 2) + ["#2a6fdb", "#9cc3f5"])
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens / s (wall clock)")
    w, m = report["workload"], report["machine"]
    ax.set_title(f"{report['model']} ({report['engine']['stats']['gemm']['dtype']}): {w['num_requests']} requests, "
                 f"prompts {w['min_prompt']}-{w['max_prompt']}, {w['output_tokens']} out; {m['threads']} threads, "
                 f"load {m['load_avg_end'][0]:.1f}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(model: str, workload: Workload, **engine_options) -> dict:
    """Everything timed in one run: {name: Seconds} plus the engine's schedule and roofline."""
    from engine.llm_engine import resolve_model_folder

    folder = resolve_model_folder(model)
    engine_time, steps, llm = run_engine(model, workload, **engine_options)
    bound = roofline(llm, steps, memory_bandwidth())
    times = {"engine": engine_time, "roofline": bound["total"]}
    dtype = llm.llm_engine.model_runner.dtype  # transformers in the same precision
    for size in workload.static_batch_sizes:
        times[f"transformers_static_{size}"] = run_transformers_static(folder, workload, size, dtype)
    sequential = run_transformers_sequential(folder, workload, dtype)
    scale = workload.num_requests / workload.sequential_subset  # the subset's time for the whole workload
    times["transformers_sequential"] = Seconds(sequential.wall * scale, sequential.cpu * scale)
    return {"times": times, "roofline": bound, "steps": len(steps), "stats": llm.llm_engine.stats()}


def summarize(model: str, workload: Workload, measured: dict, threads: int, load_start) -> dict:
    times = measured["times"]
    tok_s = {kind: {name: workload.num_output_tokens / getattr(t, kind) for name, t in times.items()}
             for kind in ("wall", "cpu")}
    best = max(workload.static_batch_sizes, key=lambda b: tok_s["wall"][f"transformers_static_{b}"])
    ratios = {
        kind: {"engine_vs_roofline": r["engine"] / r["roofline"],
               "engine_vs_best_static": r["engine"] / r[f"transformers_static_{best}"],
               "engine_vs_sequential": r["engine"] / r["transformers_sequential"]}
        for kind, r in tok_s.items()
    }
    bound = measured["roofline"]
    decode = bound["decode_steps"]
    return {
        "model": model,
        "machine": {"threads": threads, "cpus": os.cpu_count(), "load_avg_start": load_start,
                    "load_avg_end": os.getloadavg()},
        "workload": {k: v for k, v in asdict(workload).items() if k != "prompts"},
        "static_batch_sizes": workload.static_batch_sizes,
        "best_static_batch_size": best,
        "seconds": {name: asdict(t) for name, t in times.items()},
        "tok_s": tok_s,
        "ratios": ratios,
        "roofline": {"gemm": asdict(bound["gemm"]), "kv_reads": asdict(bound["kv_reads"]),
                     "kv_gib_read": bound["kv_gib_read"], "distinct_step_shapes": bound["distinct_step_shapes"]},
        "decode_steps": {"count": decode["count"], "engine": asdict(decode["engine"]), "gemm": asdict(decode["gemm"])},
        "engine": {"steps": measured["steps"], "stats": measured["stats"]},
    }


def print_report(report: dict, stem: Path) -> None:
    m, r = report["machine"], report["roofline"]
    print(f"results: {stem}.json / .png ({m['threads']} threads; load average {m['load_avg_start'][0]:.1f} -> "
          f"{m['load_avg_end'][0]:.1f} on {m['cpus']} CPUs)")
    print(f"roofline {r['gemm']['wall'] + r['kv_reads']['wall']:.1f} s wall = GEMMs {r['gemm']['wall']:.1f} s + "
          f"{r['kv_gib_read']:.1f} GiB of KV reads {r['kv_reads']['wall']:.1f} s; "
          f"engine {report['seconds']['engine']['wall']:.1f} s wall ({report['engine']['steps']} steps)")
    gemm = report["engine"]["stats"]["gemm"]
    print(f"{gemm['dtype']}, GEMM paths ({gemm['source']}): " + "; ".join(
        f"{name} " + ", ".join(f"{band['path']} M<={band['max_tokens']}" for band in bands)
        for name, bands in gemm["bands"].items()))
    d = report["decode_steps"]
    print(f"decode steps: {d['count']}, engine {d['engine']['wall']:.1f} s vs their GEMMs {d['gemm']['wall']:.1f} s")
    for kind in ("cpu", "wall"):
        rates = report["tok_s"][kind]
        line = ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
        print(f"output tok/s by {kind} time: {line}")
    for kind in ("cpu", "wall"):
        ratios = report["ratios"][kind]
        print(f"[{kind}] engine / roofline: {ratios['engine_vs_roofline']:.1%}; engine / transformers best static "
              f"(bs={report['best_static_batch_size']}): {ratios['engine_vs_best_static']:.2f}x; "
              f"engine / transformers sequential: {ratios['engine_vs_sequential']:.2f}x")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workload, one static batch size (< 3 min)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", default="auto", help="the engine's (and transformers') precision")
    parser.add_argument("--gemm", default="auto", help="the engine's GEMM path (auto: chosen per machine)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.llm_engine import resolve_model_folder

    vocab = json.loads((resolve_model_folder(args.model) / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.quick, vocab)
    load_start = os.getloadavg()
    measured = measure(args.model, workload, dtype=args.dtype, gemm=args.gemm)
    report = summarize(args.model, workload, measured, torch.get_num_threads(), load_start)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"throughput-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(report, stem.with_suffix(".png"))
    print_report(report, stem)
    return report


if __name__ == "__main__":
    main()
