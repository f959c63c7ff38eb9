"""The figures of ``bench.structured`` from its raw runs: per system, backend and batch size the constrained and
free throughput, the engine's per-step overhead and mask share, validity, and the engine / vLLM ratios.

Pure functions over the JSON the runs write (no torch, no engine), so the tests can feed them made-up runs.
A batch size's record is ``{"indices", "constrained": [run, ...], "free": [run, ...]}``, a run ``{"wall_s",
"output_tokens", "lengths", "texts", "finish_reasons"}`` and, for this engine, ``"cpu_s"`` (the process's CPU
seconds) and ``"steps"``: ``{"s", "seqs", "tokens", "mask_s", "fill_s", "advance_s"}`` per step.
"""

import json
import math
from collections.abc import Callable

OVERHEAD_TARGET = 0.10  # constrained decoding adds at most 10% to a free step at batch 64


def percentile(samples: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between the closest ranks; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def compile_summary(samples_ms: list[float], errors: dict) -> dict:
    return {"p50_ms": percentile(samples_ms, 50), "p99_ms": percentile(samples_ms, 99),
            "max_ms": max(samples_ms, default=None), "compiles": len(samples_ms), "refused": len(errors)}


def validity(record: dict, schemas: list[dict], validate: Callable[[object, dict], None]) -> dict:
    """Each request's first constrained output parsed as JSON and validated against its schema (``validate``
    raises on an invalid one); an output cut by ``max_tokens`` counts as invalid, as its document is unfinished."""
    run, valid, errors = record["constrained"][0], 0, []
    for index, text in zip(record["indices"], run["texts"], strict=True):
        try:
            validate(json.loads(text), schemas[index])
        except Exception as error:  # noqa: BLE001 - any failure to parse or validate is the finding
            errors.append(f"schema {index}: {type(error).__name__}: {str(error)[:160]} in {text[:120]!r}")
            continue
        valid += 1
    total = len(run["texts"])
    return {"outputs": total, "valid": valid, "cut_by_max_tokens": run["finish_reasons"].count("length"),
            "share_valid": valid / total if total else None, "errors": errors[:5]}


def throughput(runs: list[dict]) -> dict:
    """Output tokens per second of wall time over ``runs``."""
    wall, tokens = sum(r["wall_s"] for r in runs), sum(r["output_tokens"] for r in runs)
    return {"tok_s": tokens / wall if wall else None, "wall_s": wall, "output_tokens": tokens}


def step_overhead(record: dict, batch: int) -> dict:
    """This engine's steps at the full batch (``batch`` sequences, every one constrained in the constrained runs;
    admissions of waiting requests ride in some): mean step time constrained and free and their ratio, and the
    shares of the constrained steps' time in the mask fill, the mask as a whole (fill + apply) and the matchers'
    advance. The free runs repeat the constrained lengths, so both have the same schedule (``same_schedule``).
    Where the forward pass was timed: its mean both ways, each run's mean, and the step's time outside it,
    constrained minus free, over the free step (``overhead_outside_forward``: what the target reads)."""
    def full(runs: list[dict]) -> list[dict]:
        return [s for run in runs for s in run["steps"] if s["seqs"] == batch]

    constrained, free = full(record["constrained"]), full(record["free"])
    schedule = [[(s["seqs"], s["tokens"]) for s in run["steps"]] for run in record["constrained"] + record["free"]]
    out = {"full_batch_steps": len(constrained), "same_schedule": all(s == schedule[0] for s in schedule)}
    if not constrained or not free:
        return {**out, "overhead": None}
    c_total, f_total = sum(s["s"] for s in constrained), sum(s["s"] for s in free)
    c_mean, f_mean = c_total / len(constrained), f_total / len(free)
    share = {key: sum(s[key] for s in constrained) / c_total for key in ("fill_s", "mask_s", "advance_s")}
    out.update({"constrained_step_ms": 1e3 * c_mean, "free_step_ms": 1e3 * f_mean, "overhead": c_mean / f_mean - 1,
                "fill_share": share["fill_s"], "apply_share": share["mask_s"] - share["fill_s"],
                "mask_share": share["mask_s"], "advance_share": share["advance_s"],
                "mask_ms_per_step": 1e3 * sum(s["mask_s"] for s in constrained) / len(constrained)})
    if all("forward_s" in s for s in constrained + free):
        # The forward pass is the same work in both runs (same shapes), but its time moves with the tokens it
        # computes and with the machine; what constrained decoding adds is the step's time outside it.
        c_fwd, f_fwd = (sum(s["forward_s"] for s in steps) / len(steps) for steps in (constrained, free))
        by_run = {kind: [steps for run in record[kind] if (steps := full([run]))] for kind in ("constrained", "free")}
        out.update({"constrained_forward_ms": 1e3 * c_fwd, "free_forward_ms": 1e3 * f_fwd,
                    # each run's mean forward: how far runs of the same shapes drift apart with no change in work
                    "forward_ms_by_run": {kind: [1e3 * sum(s["forward_s"] for s in steps) / len(steps)
                                                 for steps in runs] for kind, runs in by_run.items()},
                    "forward_ratio": c_fwd / f_fwd - 1 if f_fwd else None,
                    "constrained_outside_forward_ms": 1e3 * (c_mean - c_fwd),
                    "free_outside_forward_ms": 1e3 * (f_mean - f_fwd),
                    "overhead_outside_forward": ((c_mean - c_fwd) - (f_mean - f_fwd)) / f_mean})
    return out


def batch_rows(result: dict, schemas: list[dict], validate) -> list[dict]:
    """One row per batch size of one system's result (``{"batches": {batch: record}}``)."""
    rows = []
    for batch, record in result["batches"].items():
        row = {"batch": int(batch), "requests": len(record["indices"]),
               "constrained": throughput(record["constrained"]), "free": throughput(record["free"]),
               "validity": validity(record, schemas, validate)}
        c, f = row["constrained"]["wall_s"], row["free"]["wall_s"]
        row["wall_overhead"] = c / f - 1 if f else None
        if all("cpu_s" in run for run in record["constrained"] + record["free"]):  # this engine's runs
            c, f = (sum(run["cpu_s"] for run in record[kind]) for kind in ("constrained", "free"))
            row["cpu_overhead"] = c / f - 1 if f else None
        if all("steps" in run for run in record["constrained"] + record["free"]):
            row["steps"] = step_overhead(record, int(batch))
        rows.append(row)
    return sorted(rows, key=lambda r: r["batch"])


def ratios(engine_rows: list[dict], vllm_rows: list[dict]) -> list[dict]:
    """Engine / vLLM output tok/s per batch size, constrained and free."""
    by_batch = {r["batch"]: r for r in vllm_rows}
    out = []
    for row in engine_rows:
        peer = by_batch.get(row["batch"])
        if peer is None:
            continue
        out.append({"batch": row["batch"], **{
            kind: _ratio(row[kind]["tok_s"], peer[kind]["tok_s"]) for kind in ("constrained", "free")}})
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def target_overhead(steps: dict) -> float | None:
    """The overhead the target reads: the time constrained decoding adds outside the forward pass, over the free
    step, where the forward was timed; else the whole steps' ratio."""
    if steps.get("overhead_outside_forward") is not None:
        return steps["overhead_outside_forward"]
    return steps.get("overhead")


def target_met(engine_rows: list[dict], batch: int = 64) -> bool | None:
    """Issue 21's target: overhead at most 10% at batch 64; None when batch 64 was not run."""
    for row in engine_rows:
        if row["batch"] == batch and (overhead := target_overhead(row.get("steps", {}))) is not None:
            return overhead <= OVERHEAD_TARGET
    return None
