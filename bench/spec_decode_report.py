"""``bench.spec_decode``'s rows in ``bench.report``: the summary rows of its main table and the "Speculative
decoding" section (every server run with its acceptance, the batch sweep with its crossover, saturation)."""

from pathlib import Path

SETS = {"json": "json-extractor", "edit": "paragraph edits"}


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _speedups(report: dict, system: str, streams: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in report["summary"]["tpot_speedup"]:
        if row["system"] == system and row["streams"] == streams:
            out.setdefault(row["config"], []).append(row)
    return out


def _worst(rows: list[dict]) -> float | None:
    values = [r["speedup"] for r in rows if r["speedup"] is not None]
    return min(values) if values else None


def rows(report: dict) -> list[tuple]:
    """Per stream count: this engine's TPOT speedup per method and set beside vLLM's n-gram; then saturation. The
    ratio is the best method's speedup on its worse set."""
    out = []
    for streams in (1, 4):
        engine, vllm = _speedups(report, "engine", streams), _speedups(report, "vllm", streams)
        if not engine:
            continue
        mine = "; ".join(f"{c}: " + ", ".join(f"{r['set']} {_x(r['speedup'])}" for r in rs) for c, rs in engine.items())
        peer = "; ".join(f"vLLM {c}: " + ", ".join(f"{r['set']} {_x(r['speedup'])}" for r in rs)
                         for c, rs in vllm.items()) or "vLLM: not run or failed"
        best = max((w for w in map(_worst, engine.values()) if w is not None), default=None)
        target = engine[next(iter(engine))][0]["target"]
        out.append((f"Speculative decoding: TPOT p50 off / on, {streams} stream{'s' if streams > 1 else ''}", mine,
                    peer, _x(best), f">= {target:g}x", "input-grounded: json-extractor adapter, paragraph edits"))
    saturation = report.get("offline") and report["offline"]["saturation"]
    if saturation:
        on = {k: v for k, v in report["summary"]["saturation_ratio"].items() if not k.endswith("-no-cut")}
        out.append(("Speculation on at saturation (output tok/s)",
                    ", ".join(f"{k} {saturation[k]['tok_s']:.1f}" for k in on),
                    f"off: {saturation['off']['tok_s']:.1f}",
                    f"{min(v['ratio'] for v in on.values()):.2f}" if on else "n/a", ">= 0.97",
                    "bench.throughput's workload; drafts cut above max_batch_size"))
    return out


def _acceptance(run: dict) -> str:
    a = run.get("acceptance")
    if not a or a.get("acceptance_rate") is None:
        return "-"
    length = a.get("mean_accepted_length")
    return f"{a['acceptance_rate']:.0%} / " + ("n/a" if length is None else f"{length:.2f}")


def _ms(block: dict) -> str:
    return "n/a" if block["p50"] is None else f"{block['p50']:.0f}"


def _server_lines(report: dict) -> list[str]:
    lines = ["| System | Speculation | Set | Streams | TTFT p50 ms | TPOT p50 ms | TPOT off / on | tok/s | "
             "Accepted / mean length | Same replies as off |", "|---|---|---|---|---|---|---|---|---|---|"]
    speedup = {(r["system"], r["config"], r["set"], r["streams"]): r["speedup"]
               for r in report["summary"]["tpot_speedup"]}
    failures = []
    for system, records in report["server"].items():
        for config, record in records.items():
            if not record.get("ok"):
                failures.append(f"{system} {config}: FAILED: {record.get('reason', '?')[:300]}")
                continue
            for run in record["runs"]:
                same = run.get("identical_to_off")
                lines.append(f"| {system} | {config} | {SETS[run['set']]} | {run['streams']} | {_ms(run['ttft_ms'])} | "
                             f"{_ms(run['tpot_ms'])} | {_x(speedup.get((system, config, run['set'], run['streams'])))}"
                             f" | {run['tok_s']:.1f} | {_acceptance(run)} | "
                             f"{'-' if same is None else f'{same:.0%}'} |")
    return lines + ([""] + [f"- {f}".replace("|", "/") for f in failures] if failures else [])


def _offline_lines(report: dict) -> list[str]:
    offline, summary = report["offline"], report["summary"]
    methods = list(summary["sweep_ratios"])
    lines = ["", "Offline, workload (a) at a fixed batch (drafts not cut by batch size): output tok/s, on / off.", "",
             "| Batch | off | " + " | ".join(methods) + " |", "|---" * (2 + len(methods)) + "|"]
    for row in offline["sweep"]:
        cells = [f"{row[m]['tok_s']:.1f} ({row[m]['tok_s'] / row['off']['tok_s']:.2f}, {_acceptance(row[m])})"
                 for m in methods]
        lines.append(f"| {row['batch']} | {row['off']['tok_s']:.1f} | " + " | ".join(cells) + " |")
    cross = ", ".join(f"{m} {'none (pays at every batch)' if c is None else f'from batch {c}'}"
                      for m, c in summary["crossover"].items())
    sat = offline["saturation"]
    lines += ["", f"Speculation stops paying: {cross} (SpeculativeConfig.max_batch_size default: 8). Saturation "
              f"({offline['saturation_workload']['requests']} requests x "
              f"{offline['saturation_workload']['output_tokens']} tokens): off {sat['off']['tok_s']:.1f} tok/s; "
              + ", ".join(f"{k} {v['tok_s']:.1f} ({summary['saturation_ratio'][k]['ratio']:.2f})"
                          for k, v in sat.items() if k != "off") + "."]
    return lines


def table(item: tuple[Path, dict] | None) -> list[str]:
    """The "Speculative decoding" section of the report."""
    lines = ["", "## Speculative decoding", ""]
    if item is None:
        return lines + ["`python -m bench.spec_decode`: not run."]
    path, report = item
    m = report["machine"]
    lines += [f"From `{path.name}`{' (quick)' if report.get('quick') else ''}: {m['cores']} cores of {m['cpu']}, load "
              f"average {m['load_avg_start'][0]:.1f} at the start; {report['dtype']}; greedy, EOS honoured. This "
              "engine: " + ", ".join(f"{k} {v}" for k, v in report["configs"].items() if v) + f"; vLLM: "
              f"{report['vllm_spec']}. Accepted: drafted tokens kept; mean length: kept per verified draft.", ""]
    lines += _server_lines(report)
    if report.get("offline"):
        lines += _offline_lines(report)
    return lines
