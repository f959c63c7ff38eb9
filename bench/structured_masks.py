"""Per-step cost of constrained decoding on CPU, for each structured-output backend, at batch 1, 8 and 64.

``python -m bench.structured_masks [--batches 1,8,64] [--steps 32] [--repeats 5] [--threads N]``
Every sequence of the batch is constrained by one JSON Schema of moderate size (8 typed fields, an enum, a nested
array of objects) and replays a valid document chosen by a masked random walk. Per step it times the batch mask
fill (``fill_bitmask_batch``), the mask applied to [batch, 49152] fp32 logits (``apply_bitmask``: the same
C pass for both backends) and each matcher's ``accept_token``. Compile time is timed cold (a fresh
cache) and cached. Each figure is the median of ``--repeats`` runs with its min-max spread; other jobs share
the cores, so the figures are indicative. Writes ``bench/results/structured_masks.json``.
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from engine.models.prepare import resolve_model
from engine.structured import BACKENDS, GrammarCache, GrammarTokenizer, StructuredOutputsParams, make_backend
from engine.structured.bitmask import apply_bitmask

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{2,10}$"},
        "email": {"type": "string", "pattern": "^[a-z]{3,8}@[a-z]{3,8}\\.com$"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "active": {"type": "boolean"},
        "joined": {"type": "string", "format": "date"},
        "role": {"enum": ["admin", "editor", "viewer", "guest"]},
        "orders": {
            "type": "array", "minItems": 1, "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 20}},
                "required": ["sku", "qty"], "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "email", "score", "active", "joined", "role", "orders"],
    "additionalProperties": False,
}
PARAMS = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)


def spread(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def documents(backend, count: int, min_tokens: int) -> list[list[int]]:
    """``count`` token sequences of valid documents (EOS last), each at least ``min_tokens`` long."""
    grammar, vocab = backend.compile(PARAMS), backend.vocab_size
    generator, docs = torch.Generator().manual_seed(0), []
    while len(docs) < count:
        matcher, bitmask, tokens = backend.new_matcher(grammar), backend.allocate_bitmask(1), []
        while not matcher.is_terminated():
            matcher.fill_bitmask(bitmask, 0)
            logits = torch.randn(1, vocab, generator=generator)  # [1, vocab]
            apply_bitmask(logits, bitmask, [0])
            tokens.append(int(logits.argmax()))
            assert matcher.accept_token(tokens[-1])
        if len(tokens) > min_tokens:
            docs.append(tokens)
    return docs


def run_steps(backend, docs: list[list[int]], num_steps: int) -> dict[str, float]:
    """One run: fresh matchers replay their documents for ``num_steps`` steps; mean ms per step of each phase.
    ``loop_fill`` is the per-row fill of the same states, for comparison (its order against the batch fill
    alternates, so neither always finds the caches warm)."""
    grammar, batch = backend.compile(PARAMS), len(docs)
    matchers = [backend.new_matcher(grammar) for _ in docs]
    bitmask = backend.allocate_bitmask(batch)  # [batch, words]
    rows = list(range(batch))
    pairs = list(zip(matchers, rows, strict=True))
    totals = dict.fromkeys(("fill_ms", "loop_fill_ms", "apply_ms", "accept_ms"), 0.0)
    generator = torch.Generator().manual_seed(1)
    for step in range(num_steps):
        logits = torch.randn(batch, backend.vocab_size, generator=generator)  # [batch, vocab]
        for phase in ("fill_ms", "loop_fill_ms") if step % 2 else ("loop_fill_ms", "fill_ms"):
            totals[phase] += fill_time(backend, pairs, bitmask, batch_fill=phase == "fill_ms")
        start = time.perf_counter()
        apply_bitmask(logits, bitmask, rows)
        applied = time.perf_counter()
        accepted = [matcher.accept_token(doc[step]) for matcher, doc in zip(matchers, docs, strict=True)]
        totals["apply_ms"] += applied - start
        totals["accept_ms"] += time.perf_counter() - applied
        if not all(accepted):
            raise RuntimeError(f"{backend.name} refused a document's token at step {step}")
    return {phase: 1e3 * total / num_steps for phase, total in totals.items()}


def fill_time(backend, pairs, bitmask: torch.Tensor, *, batch_fill: bool) -> float:
    start = time.perf_counter()
    if batch_fill:
        backend.fill_bitmask_batch(bitmask, pairs)
    else:
        for matcher, row in pairs:
            matcher.fill_bitmask(bitmask, row)
    return time.perf_counter() - start


def step_rows(backend, docs: list[list[int]], batches: list[int], num_steps: int, repeats: int) -> list[dict]:
    rows = []
    for batch in batches:
        run_steps(backend, docs[:batch], num_steps)  # warm-up
        runs = [run_steps(backend, docs[:batch], num_steps) for _ in range(repeats)]
        row = {"backend": backend.name, "batch": batch}
        row.update({phase: spread([r[phase] for r in runs]) for phase in runs[0]})
        rows.append(row)
    return rows


def compile_times(tokenizer, name: str, threads: int | None, repeats: int) -> dict:
    cold = []
    for _ in range(repeats):
        backend = make_backend(tokenizer, name, cache=GrammarCache(), num_threads=threads)
        start = time.perf_counter()
        backend.compile(PARAMS)
        cold.append(1e3 * (time.perf_counter() - start))
    cached = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.compile(StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
        cached.append(1e3 * (time.perf_counter() - start))
    start = time.perf_counter()
    make_backend(tokenizer, name, num_threads=threads)
    return {"backend": name, "cold_ms": spread(cold), "cached_ms": spread(cached),
            "backend_build_ms": 1e3 * (time.perf_counter() - start)}


def print_table(step: list[dict], compiles: list[dict]) -> None:
    def cell(s: dict) -> str:
        return f"{s['median']:7.3f} ({s['min']:.3f}-{s['max']:.3f})"

    phases = ("fill_ms", "loop_fill_ms", "apply_ms", "accept_ms")
    print(f"\n{'ms per step, median (min-max)':>40}")
    print(f"{'backend':9} {'batch':>5}  " + "  ".join(f"{p[:-3]:>24}" for p in phases))
    for r in step:
        print(f"{r['backend']:9} {r['batch']:5d}  " + "  ".join(f"{cell(r[p]):>24}" for p in phases))
    print(f"\n{'backend':9}  {'compile cold ms':>26}  {'compile cached ms':>26}  {'backend build ms':>16}")
    for c in compiles:
        print(f"{c['backend']:9}  {cell(c['cold_ms']):>26}  {cell(c['cached_ms']):>26}  {c['backend_build_ms']:16.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="mask-fill threads (0: each library's default)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    threads = args.threads or None
    torch.set_num_threads(1)  # the fill threads are the libraries'; torch only generates logits here
    tokenizer = GrammarTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
    backends = [make_backend(tokenizer, name, num_threads=threads) for name in BACKENDS]
    docs = documents(backends[0], max(batches), min_tokens=args.steps)
    step, compiles = [], []
    for backend in backends:
        step += step_rows(backend, docs, batches, args.steps, args.repeats)
        compiles.append(compile_times(tokenizer, backend.name, threads, args.repeats))
    print_table(step, compiles)
    report = {
        "schema": SCHEMA, "steps": args.steps, "repeats": args.repeats, "fill_threads": threads or "library default",
        "mean_document_tokens": statistics.mean(len(d) for d in docs), "step": step, "compile": compiles,
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "python": platform.python_version(),
                    "torch": torch.__version__},
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "structured_masks.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"\nresults: {out} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; indicative)")


if __name__ == "__main__":
    main()
