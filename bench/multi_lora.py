"""Multi-LoRA serving: throughput at saturation and latency under load, against the base model and PEFT.

``python -m bench.multi_lora [--quick] [--requests N] [--model NAME] [--threads N] [--adapter-counts 1,8,32,128]``

Every adapter has rank 16 on all seven projections (``max_lora_rank=16``, ``max_loras=8``, a host tier holding
them all). Measured in one run on the same machine:
  * throughput at saturation (all requests submitted at once) with 1, 8, 32 and 128 adapters, popularity uniform
    and power law (alpha 0.5, S-LoRA's generator), the host tier warm; against this engine on the base model alone
    (LoRA off) and against transformers + PEFT serving one request at a time (``set_adapter`` per request, 4
    adapters), both on the same prompts;
  * latency under load: Poisson arrivals at 80% of the 32-adapter saturation rate, uniform and skewed, starting
    cold (no adapter loaded): TTFT and TPOT p50/p99, slot hit rate, adapter load time p50/p99 and the TTFT of the
    requests whose adapter was cold.
Workload: 1,024 requests (``--quick``: 64; ``--requests N``), prompts of 16-256 tokens (16-128), 64 greedy output
tokens (32), EOS ignored. Saturation means the queue never runs dry: with ``max_loras=8`` at most eight adapters'
sequences share a step, so the engine can fill its ``max_num_seqs=256`` only when the resident adapters have 32
requests each waiting, which 1,024 requests over 32 adapters give (256 requests give 8 each: the LoRA engine then
runs at most 64 sequences against the base model's 256, a queue-depth limit rather than its speed; ``--requests 256``
measures that case, and ``--quick`` is that kind of run too).
Results go to ``bench/results/multi-lora-<time>.json`` and ``.png``; the last lines printed are the targets.
"""

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.lora_workload import (
    adapter_folders,
    make_requests,
    percentile,
    poisson_arrivals,
    popularity,
    run_all_at_once,
    run_poisson,
)

RESULTS = Path(__file__).resolve().parent / "results"
RANK, MAX_LORAS, ALPHA_SKEWED, LOAD = 16, 8, 0.5, 0.8


@dataclass
class Settings:
    num_requests: int
    prompt_range: tuple[int, int]
    output_tokens: int
    peft_requests: int
    latency_requests: int
    adapter_counts: list[int] = field(default_factory=lambda: [1, 8, 32, 128])


def settings(quick: bool) -> Settings:
    return Settings(64, (16, 128), 32, 4, 48) if quick else Settings(1024, (16, 256), 64, 8, 160)


def make_llm(model: str, *, lora: bool, num_adapters: int):
    from engine import LLM

    extra = dict(enable_lora=True, max_loras=MAX_LORAS, max_cpu_loras=max(num_adapters, MAX_LORAS),
                 max_lora_rank=RANK) if lora else {}
    # No prefix caching: the runs reuse the same prompts, and a later run would skip the prefill an earlier one
    # cached (this made the second of two identical 1-adapter runs 1.8x faster). Within a run, prompts share nothing.
    return LLM(model, seed=0, enable_prefix_caching=False, **extra)


def lora_requests(folders: list[Path]) -> list:
    from engine import LoRARequest

    return [LoRARequest(f"bench-{i}", f"bench-{i}", str(folder)) for i, folder in enumerate(folders)]


def warm(engine, requests: list) -> None:
    """Every adapter of the run in the host tier (slots empty): saturation runs measure serving, not disk reads."""
    for adapter in engine.list_adapters():
        engine.unload_adapter(adapter["id"])
    futures = [engine.load_adapter(r) for r in requests]
    while not all(f.done() for f in futures):
        engine.step()
    for f in futures:
        f.result()


def saturation(engine, s: Settings, vocab: int, loras: list, num_adapters: int, alpha: float | None, params) -> dict:
    rng = random.Random(num_adapters)
    assignment = [None] * s.num_requests if alpha is None else popularity(s.num_requests, num_adapters, alpha, rng)
    requests = make_requests(s.num_requests, s.prompt_range, vocab, assignment, seed=1)
    used = sorted({r.adapter for r in requests if r.adapter is not None})
    if alpha is not None:
        warm(engine, [loras[i] for i in used])
    stats_before = engine.stats()
    seconds = run_all_at_once(engine, requests, loras, params)
    stats_after = engine.stats()
    before, after = stats_before["adapters"], stats_after["adapters"]
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return {"adapters": num_adapters, "popularity": "base" if alpha is None else f"alpha={alpha}",
            "distinct_adapters_used": len(used), "seconds": seconds,
            "tok_s": s.num_requests * s.output_tokens / seconds, "req_s": s.num_requests / seconds,
            "slot_hit_rate": hits / (hits + misses) if hits + misses else None,
            "evictions": after["evictions"] - before["evictions"],
            "steps": stats_after["steps"] - stats_before["steps"]}


def latency(model: str, s: Settings, vocab: int, folders: list[Path], alpha: float, rate: float, params) -> dict:
    llm = make_llm(model, lora=True, num_adapters=len(folders))  # fresh: every adapter starts cold
    engine, loras = llm.llm_engine, lora_requests(folders)
    assignment = popularity(s.latency_requests, len(folders), alpha, random.Random(7))
    requests = make_requests(s.latency_requests, s.prompt_range, vocab, assignment, seed=2)
    poisson_arrivals(requests, rate, seed=3)
    rows = run_poisson(engine, requests, loras, params)
    stats = engine.stats()
    adapters, loads = stats["adapters"], stats["adapter_loads"]
    ttft, tpot = [r["ttft"] for r in rows], [r["tpot"] for r in rows]
    cold = [r["ttft"] for r in rows if r["cold"]]
    total = adapters["hits"] + adapters["misses"]
    engine.adapters.close()
    return {"popularity": f"alpha={alpha}", "rate_req_s": rate, "requests": len(rows),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "slot_hit_rate": adapters["hits"] / total if total else None, "evictions": adapters["evictions"],
            "cold_requests": len(cold), "cold_ttft_p50_s": percentile(cold, 50),
            "cold_ttft_p99_s": percentile(cold, 99), "adapter_loads": loads["loads"],
            "load_ms_p50": adapters["load_ms_p50"], "load_ms_p99": loads["load_ms_p99"]}


def peft_baseline(folder: Path, s: Settings, vocab: int, adapters: list[Path]) -> dict:
    """transformers + PEFT, one request at a time, ``set_adapter`` to the request's adapter (4 loaded)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                      adapters[0], adapter_name="a0")
    for i, path in enumerate(adapters[1:4], start=1):
        model.load_adapter(path, adapter_name=f"a{i}")
    model.eval()
    requests = make_requests(s.peft_requests, s.prompt_range, vocab, [i % 4 for i in range(s.peft_requests)], 1)
    start = time.perf_counter()
    for request in requests:
        model.set_adapter(f"a{request.adapter}")
        ids = torch.tensor([request.prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=s.output_tokens, min_new_tokens=s.output_tokens)
        assert out.shape[1] - ids.shape[1] == s.output_tokens
    seconds = time.perf_counter() - start
    return {"requests": len(requests), "adapters": 4, "seconds": seconds,
            "tok_s": len(requests) * s.output_tokens / seconds}


def run(model: str, s: Settings) -> dict:
    from devstack.services import state_dir
    from engine import SamplingParams
    from engine.llm_engine import resolve_model_folder

    folder = resolve_model_folder(model)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    folders = adapter_folders(folder, max(s.adapter_counts), RANK, state_dir() / "bench-adapters")
    params = SamplingParams(temperature=0, max_tokens=s.output_tokens, ignore_eos=True)
    base_llm = make_llm(model, lora=False, num_adapters=0)
    base_llm.generate([[100] * 8], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    base = saturation(base_llm.llm_engine, s, vocab, [], 0, None, params)
    del base_llm
    llm = make_llm(model, lora=True, num_adapters=max(s.adapter_counts))
    engine, loras = llm.llm_engine, lora_requests(folders)
    # Warm-up of the LoRA path too (first touch of the slot buffers, the first load), as the base run had its own.
    llm.generate([[100] * 8] * 2, SamplingParams(max_tokens=2), lora_request=[loras[0], None], use_tqdm=False)
    runs = []
    for count in s.adapter_counts:
        for alpha in (1.0, ALPHA_SKEWED):
            runs.append(saturation(engine, s, vocab, loras, count, alpha, params))
            print(f"{count:4d} adapters, alpha {alpha}: {runs[-1]['tok_s']:.1f} tok/s", flush=True)
    engine.adapters.close()
    del llm
    rate = LOAD * next(r["req_s"] for r in runs if r["adapters"] == 32 and r["popularity"] == "alpha=1.0")
    under_load = [latency(model, s, vocab, folders[:32], alpha, rate, params) for alpha in (1.0, ALPHA_SKEWED)]
    peft = peft_baseline(folder, s, vocab, folders)
    return {"base": base, "saturation": runs, "latency": under_load, "peft": peft}


def targets(report: dict) -> dict:
    base, peft = report["base"]["tok_s"], report["peft"]["tok_s"]
    at32 = {r["popularity"]: r["tok_s"] for r in report["saturation"] if r["adapters"] == 32}
    uniform, skewed = report["latency"]
    return {
        "throughput_32_uniform_vs_base": at32["alpha=1.0"] / base, "throughput_32_skewed_vs_base":
            at32[f"alpha={ALPHA_SKEWED}"] / base, "target_vs_base": 0.8,
        "throughput_32_uniform_vs_peft": at32["alpha=1.0"] / peft, "target_vs_peft": 15.0,
        "ttft_p99_skewed_vs_uniform": skewed["ttft_p99_s"] / uniform["ttft_p99_s"], "target_ttft_ratio": 3.0,
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    names = ["base only", "PEFT\n1 at a time"] + [f"{r['adapters']} adapters\n{r['popularity']}"
                                                  for r in report["saturation"]]
    values = [report["base"]["tok_s"], report["peft"]["tok_s"]] + [r["tok_s"] for r in report["saturation"]]
    colors = ["#555", "#bbb"] + ["#2a6fdb" if r["popularity"] == "alpha=1.0" else "#f08a24"
                                 for r in report["saturation"]]
    bars = left.bar(range(len(names)), values, color=colors)
    left.bar_label(bars, fmt="%.0f", fontsize=8)
    left.set_xticks(range(len(names)), names, fontsize=7)
    left.axhline(0.8 * report["base"]["tok_s"], color="#555", linestyle="--", linewidth=1, label="80% of base")
    left.set_ylabel("output tokens / s at saturation")
    left.legend(fontsize=8)
    labels = [run["popularity"] for run in report["latency"]]
    for offset, key, color in ((-0.2, "ttft_p50_s", "#9cc3f5"), (0.2, "ttft_p99_s", "#2a6fdb")):
        right.bar([i + offset for i in range(len(labels))], [run[key] for run in report["latency"]], width=0.4,
                  color=color, label=key.replace("_s", "").replace("_", " "))
    right.set_xticks(range(len(labels)), labels)
    right.set_ylabel("seconds")
    right.set_title(f"32 adapters, Poisson at {LOAD:.0%} of saturation", fontsize=9)
    right.legend(fontsize=8)
    machine = report["machine"]
    fig.suptitle(f"{report['model']}: rank {RANK} on 7 projections, max_loras {MAX_LORAS}, "
                 f"{machine['threads']} threads, load avg {machine['load_avg'][0]:.1f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workload (about 5 minutes on a quiet machine)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--adapter-counts", default="1,8,32,128",
                        help="numbers of adapters of the saturation runs, comma-separated (32 is always run: the "
                             "targets are about it)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests of each saturation run (default 1024, --quick 64)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = settings(args.quick)
    if args.requests is not None:
        if args.requests < 1:
            parser.error(f"--requests must be positive, got {args.requests}")
        s.num_requests = args.requests
    try:
        counts = {int(c) for c in args.adapter_counts.split(",") if c.strip()}
    except ValueError:
        parser.error(f"--adapter-counts must be integers, got {args.adapter_counts!r}")
    if any(c < 1 for c in counts):
        parser.error("--adapter-counts must be positive")
    s.adapter_counts = sorted(counts | {32})
    started = time.perf_counter()
    report = {"model": args.model, "settings": asdict(s), "rank": RANK, "max_loras": MAX_LORAS,
              **run(args.model, s)}
    report["machine"] = {"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                         "wall_s": time.perf_counter() - started}
    report["targets"] = targets(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"multi-lora-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str))
    plot(report, stem.with_suffix(".png"))
    t = report["targets"]
    print(f"results: {stem}.json / .png ({report['machine']['wall_s']:.0f} s, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"base only {report['base']['tok_s']:.1f} tok/s; PEFT one at a time {report['peft']['tok_s']:.1f} tok/s")
    for r in report["latency"]:
        print(f"latency {r['popularity']} at {r['rate_req_s']:.2f} req/s: TTFT p50 {r['ttft_p50_s']:.2f} s p99 "
              f"{r['ttft_p99_s']:.2f} s, TPOT p50 {r['tpot_p50_s'] * 1e3:.0f} ms p99 {r['tpot_p99_s'] * 1e3:.0f} ms, "
              f"slot hits {r['slot_hit_rate'] or 0:.0%}, load p50 {r['load_ms_p50']:.0f} ms "
              f"p99 {r['load_ms_p99']:.0f} ms")
    print(f"32 adapters / base: uniform {t['throughput_32_uniform_vs_base']:.2f}, skewed "
          f"{t['throughput_32_skewed_vs_base']:.2f} (target >= 0.8)")
    print(f"32 adapters / PEFT: {t['throughput_32_uniform_vs_peft']:.1f}x (target >= 15x)")
    print(f"p99 TTFT skewed / uniform at {LOAD:.0%} load: {t['ttft_p99_skewed_vs_uniform']:.2f} (target <= 3)")
    return report


if __name__ == "__main__":
    main()
