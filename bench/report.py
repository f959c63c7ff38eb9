"""The benchmark report: the latest result of each benchmark in ``bench/results/`` as one Markdown table, beside its
peer measured in the same run and its target.

``python -m bench.report`` (the last step of ``make bench``) writes ``bench/results/REPORT.md`` and
``bench/results/summary.png`` (each ratio against its target) and prints the table, which the README's
"Benchmarks" section copies. A benchmark with no result yet is listed as not run. The peers section (``python -m
bench.peers``) follows: each ratio beside the two runs of the same file it came from, then every run, failed ones
with their reason. The structured-outputs section (``python -m bench.structured``) comes last: this engine's
constrained steps against its free ones per backend and batch size, beside vLLM's structured outputs in the same run.
The speculative-decoding section (``python -m bench.spec_decode``, rendered by ``bench.spec_decode_report``) ends it.
"""

import json
import os
import platform
from pathlib import Path

from bench import spec_decode_report
from bench.structured_summary import OVERHEAD_TARGET, target_overhead

RESULTS = Path(__file__).resolve().parent / "results"


def latest(prefix: str) -> tuple[Path, dict] | None:
    paths = sorted(RESULTS.glob(f"{prefix}-2*.json"), key=lambda p: p.stat().st_mtime)
    return (paths[-1], json.loads(paths[-1].read_text())) if paths else None


def throughput_rows(report: dict) -> list[tuple]:
    tok, ratio, best = report["tok_s"], report["ratios"], report["best_static_batch_size"]
    threads = report["machine"]["threads"]
    return [
        ("Offline throughput (output tok/s, wall)", f"{tok['wall']['engine']:.1f}",
         f"transformers static batch {best}: {tok['wall'][f'transformers_static_{best}']:.1f}",
         f"{ratio['wall']['engine_vs_best_static']:.2f}x", "about 2.5x", f"{threads} threads"),
        ("", "", f"transformers one at a time: {tok['wall']['transformers_sequential']:.1f}",
         f"{ratio['wall']['engine_vs_sequential']:.2f}x", "about 12x", ""),
        ("Engine against its roofline", "", "GEMMs + KV reads of its own schedule",
         f"{ratio['wall']['engine_vs_roofline']:.0%}", ">= 75%", ""),
    ]


def multi_lora_rows(report: dict) -> list[tuple]:
    t = report["targets"]
    at32 = {r["popularity"]: r["tok_s"] for r in report["saturation"] if r["adapters"] == 32}
    uniform, skewed = report["latency"]
    others = [r for r in report["saturation"] if r["popularity"] == "alpha=1.0" and r["adapters"] != 32]
    base = report["base"]["tok_s"]
    curve = []
    if others:  # a run of 32 adapters only has no curve to show
        curve.append((f"{' / '.join(str(r['adapters']) for r in others)} adapters, uniform",
                      " / ".join(f"{r['tok_s']:.1f}" for r in others), f"base model only: {base:.1f}",
                      " / ".join(f"{r['tok_s'] / base:.2f}" for r in others), "", "for the shape of the curve"))
    return curve + [
        ("32 adapters, uniform (output tok/s)", f"{at32['alpha=1.0']:.1f}",
         f"base model only: {base:.1f}", f"{t['throughput_32_uniform_vs_base']:.2f}", ">= 0.80",
         f"rank {report['rank']}, max_loras {report['max_loras']}, {report['settings']['num_requests']:,} requests"),
        ("32 adapters, power law 0.5", f"{at32['alpha=0.5']:.1f}", f"base model only: {base:.1f}",
         f"{t['throughput_32_skewed_vs_base']:.2f}", ">= 0.80", ""),
        ("32 adapters against PEFT", f"{at32['alpha=1.0']:.1f}",
         f"transformers+PEFT one at a time: {report['peft']['tok_s']:.1f}",
         f"{t['throughput_32_uniform_vs_peft']:.1f}x", ">= 15x", ""),
        ("p99 TTFT at 80% load, skewed / uniform", f"{skewed['ttft_p99_s']:.2f} s",
         f"uniform: {uniform['ttft_p99_s']:.2f} s",
         f"{t['ttft_p99_skewed_vs_uniform']:.2f}", "<= 3", f"slot hits {skewed['slot_hit_rate'] or 0:.0%}"),
    ]


def serve_rows(report: dict) -> list[tuple]:
    saturation = report["runs"][0]
    return [("Server at saturation (output tok/s)", f"{saturation['output_tok_s']:.1f}",
             f"offline LLM.generate: {report['offline_tok_s']:.1f}", f"{report['saturation_vs_offline']:.2f}",
             f">= {report['target']:.2f}", f"load client on the same cores ({saturation['client_cpu_share']:.0%})")]


def gateway_rows(report: dict) -> list[tuple]:
    blocks = report["blocks"]
    c1, c16 = blocks["ttft_c1"], blocks["throughput_c16"]
    return [
        ("Gateway: added p50 TTFT, 1 stream", f"{c1['gateway']['ttft_p50_ms']:.1f} ms",
         f"engine direct: {c1['direct']['ttft_p50_ms']:.1f} ms", f"+{c1['added_ttft_p50_ms']:.1f} ms", "< 10 ms",
         f"gateway CPU {report['gateway_cpu_ms_per_request']:.1f} ms/request"),
        ("Gateway: 16 streams (tok/s)", f"{c16['gateway']['tokens_per_s']:.0f}",
         f"engine direct: {c16['direct']['tokens_per_s']:.0f}", f"-{c16['throughput_loss']:.0%}", "< 10% loss",
         "tiny model, so the gateway's cost shows" + _interval(c16)),
    ]


def structured_rows(report: dict) -> list[tuple]:
    """One row per backend: this engine's step overhead at the largest batch, against its unconstrained steps."""
    rows = []
    for backend in report["backends"]:
        engine = report["summary"]["systems"].get(f"engine-{backend}") or []
        if not engine or (steps := engine[-1].get("steps") or {}).get("overhead") is None:
            continue
        if steps.get("overhead_outside_forward") is None:
            rows.append((f"Constrained step at batch {engine[-1]['batch']} ({backend})",
                         f"{steps['constrained_step_ms']:.1f} ms", f"unconstrained: {steps['free_step_ms']:.1f} ms",
                         f"{steps['overhead']:+.1%}", "<= 10%", f"mask {steps['mask_share']:.1%} of the step; every "
                         "sequence under a JSON schema"))
            continue
        rows.append((f"Constrained decoding's cost a step at batch {engine[-1]['batch']} ({backend})",
                     f"{steps['constrained_outside_forward_ms'] - steps['free_outside_forward_ms']:.1f} ms "
                     "outside the forward pass",
                     f"unconstrained step: {steps['free_step_ms']:.1f} ms", f"{steps['overhead_outside_forward']:+.1%}",
                     "<= 10%", f"whole steps {steps['free_step_ms']:.1f} -> {steps['constrained_step_ms']:.1f} ms "
                     f"({steps['overhead']:+.1%}), of which the forward pass {steps['forward_ratio']:+.1%}; mask "
                     f"{steps['mask_share']:.1%} of the step; every sequence under a JSON schema"))
    return rows


def _pair(row: dict | None) -> str:
    if row is None:
        return "not run"
    c, f = row["constrained"]["tok_s"], row["free"]["tok_s"]
    return f"{c:.1f} / {f:.1f}" if c and f else "n/a"


def structured_table(item: tuple[Path, dict] | None) -> list[str]:
    """The structured-outputs section: per backend and batch size this engine's step overhead and mask share,
    both systems' tok/s constrained and free, engine / vLLM, validity; then the cold compiles and any failures."""
    lines = ["", "## Structured outputs", ""]
    if item is None:
        return lines + ["`python -m bench.structured`: not run."]
    path, report = item
    m, s, summary = report["machine"], report["settings"], report["summary"]
    lines += [f"From `{path.name}`{' (quick)' if report.get('quick') else ''}: {m['cores']} cores of {m['cpu']}, "
              f"load average {m['load_avg_start'][0]:.1f} at the start; {report['dtype']}; "
              f"{len(report['suite'])} schemas cycled, greedy, max_tokens {s['max_tokens']}; free runs repeat each "
              "request's constrained length. Whole step: mean step time at the full batch, constrained / free - 1 (the "
              "forward pass's share of it in brackets: the same work both ways, whose time drifts between runs); "
              "outside the forward: the step's time outside the forward pass, constrained minus free, over the free "
              "step (what constrained decoding adds; the target's reading); whole runs: their wall and CPU time, "
              "constrained / free - 1.", "",
              "| Backend | Batch | Engine step free -> constrained | Whole step (forward) | Outside the forward | "
              "Mask a step, share (fill + apply) | Engine run, wall / CPU | Engine tok/s constrained / free | "
              "vLLM tok/s constrained / free | Engine / vLLM constrained | Valid engine / vLLM |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for backend in report["backends"]:
        engine = summary["systems"].get(f"engine-{backend}") or []
        peer = {r["batch"]: r for r in summary["systems"].get(f"vllm-{backend}") or []}
        ratio = {r["batch"]: r["constrained"] for r in summary.get("ratios", {}).get(backend, [])}
        for row in engine:
            st, vp = row.get("steps") or {}, peer.get(row["batch"])
            step = "n/a" if st.get("overhead") is None else \
                f"{st['free_step_ms']:.1f} -> {st['constrained_step_ms']:.1f} ms"
            overhead = "n/a" if st.get("overhead") is None else f"{st['overhead']:+.1%}" + (
                f" ({st['forward_ratio']:+.1%})" if st.get("forward_ratio") is not None else "")
            outside = "n/a" if st.get("overhead_outside_forward") is None else (
                f"{st['free_outside_forward_ms']:.1f} -> {st['constrained_outside_forward_ms']:.1f} ms, "
                f"{st['overhead_outside_forward']:+.1%}")
            if row["batch"] == 64 and (added := target_overhead(st)) is not None:  # marked where the target reads
                mark = f" (target <= 10%: {'met' if added <= OVERHEAD_TARGET else 'not met'})"
                if st.get("overhead_outside_forward") is not None:
                    outside += mark
                else:
                    overhead += mark
            mask = "n/a" if st.get("overhead") is None else (f"{st['mask_ms_per_step']:.1f} ms, {st['mask_share']:.1%} "
                                                             f"({st['fill_share']:.1%} + {st['apply_share']:.1%})")
            valid = f"{row['validity']['valid']}/{row['validity']['outputs']}" + (
                f" / {vp['validity']['valid']}/{vp['validity']['outputs']}" if vp else "")
            r, whole = ratio.get(row["batch"]), " / ".join(
                "n/a" if row.get(k) is None else f"{row[k]:+.0%}" for k in ("wall_overhead", "cpu_overhead"))
            lines.append(f"| {backend} | {row['batch']} | {step} | {overhead} | {outside} | {mask} | {whole} | "
                         f"{_pair(row)} | {_pair(vp)} | {'n/a' if r is None else f'{r:.2f}'} | {valid} |")
    compiles = "; ".join(f"{b} p50 {c['p50_ms']:.1f} ms, p99 {c['p99_ms']:.1f} ms ({c['compiles']} compiles"
                         + (f", {c['refused']} refused" if c["refused"] else "") + ")"
                         for b, c in summary["compile"].items() if c["compiles"])
    lines += ["", f"Grammar compile, cold (a fresh backend and cache), over the suite: {compiles or 'not run'}."]
    for key, run in report["runs"].items():
        if not run.get("ok"):
            reason = run.get("reason") or "?"
            lines.append(f"\n{key}: FAILED: {reason[:300].replace('|', '/')}")
        if run.get("refused"):
            lines.append(f"\n{key} refused {len(run['refused'])} of the suite's schemas (left out of its runs).")
    return lines


def _interval(block: dict) -> str:
    interval = block.get("throughput_loss_interval_95")  # absent from results before it was measured
    return "" if interval is None else f"; loss 95% interval {interval[0]:.0%} to {interval[1]:.0%}"


BENCHMARKS = [("throughput", "python -m bench.throughput", throughput_rows),
              ("multi-lora", "python -m bench.multi_lora", multi_lora_rows),
              ("serve", "python -m bench.serve", serve_rows),
              ("gateway", "python -m bench.gateway", gateway_rows),
              ("structured", "python -m bench.structured", structured_rows),
              ("spec_decode", "python -m bench.spec_decode", spec_decode_report.rows)]


def _figure(value: float | None, measure: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f} ms" if "ms" in measure else f"{value:.1f}"


def _run_figures(run: dict) -> str:
    if not run.get("ok"):
        reason = run.get("reason") or (run.get("error", "").strip().splitlines() or ["?"])[-1]
        return "FAILED: " + reason[:200].replace("|", "/")
    if "runs" in run:
        return "; ".join(f"{n} stream{'s' if n != '1' else ''}: TTFT {r['ttft_ms']['p50']:.0f} ms, TPOT "
                         f"{r['tpot_ms']['p50']:.1f} ms, {r['tok_s']:.1f} tok/s" for n, r in run["runs"].items())
    return f"{run['tok_s']:.1f} tok/s" + (f" ({run['via']})" if run.get("via") else "")


def peers_table(item: tuple[Path, dict] | None) -> list[str]:
    """The peers section: every ratio beside the two runs it came from, then every run (failures included)."""
    lines = ["", "## Peers, measured in the same run", ""]
    if item is None:
        return lines + ["`python -m bench.peers`: not run."]
    path, report = item
    m, w = report["machine"], report["workloads"]
    lines += [f"From `{path.name}`{' (quick)' if report.get('quick') else ''}: {m['cores']} cores of {m['cpu']} "
              f"({', '.join(m['bf16']) or 'no native bf16'}), load average {m['load_avg_start'][0]:.1f} at the "
              f"start. Offline {w['offline']['requests']} requests x {w['offline']['output_tokens']} tokens, adapters "
              f"{w['adapters']['requests']} x {w['adapters']['output_tokens']} over {report['adapters']['count']} "
              f"rank-{report['adapters']['rank']} adapters, streams {w['streams']['output_tokens']} tokens. Ratio = "
              "this engine / the peer run beside it (for TTFT and TPOT lower is better).", "",
              "| Workload | Precision | Measure | This engine (run) | Peer (run) | Ratio | Target |",
              "|---|---|---|---|---|---|---|"]
    for r in report["summary"]["ratios"]:
        target = "" if r["target"] is None else \
            f"{'>=' if r['higher_is_better'] else '<='} {r['target']:g} ({'met' if r['met'] else 'not met'})"
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['workload']} | {r['dtype']} | {r['measure']} | {_figure(r['engine'], r['measure'])} "
                     f"({r['engine_run']}) | {_figure(r['peer'], r['measure'])} ({r['peer_run']}) | {ratio} | "
                     f"{target} |")
    lines += ["", "| System | Workload | Precision | Variant | Result | Start-up |", "|---|---|---|---|---|---|"]
    for run in report["runs"]:
        startup = f"{run['startup_s']:.0f} s" if run.get("startup_s") is not None else ""
        lines.append(f"| {run['system']} | {run['workload']} | {run['dtype']} | {run['variant']} | "
                     f"{_run_figures(run)} | {startup} |")
    agreement = [a for a in report["summary"].get("agreement", []) if a["agree"] is not None]
    if agreement:
        pairs = "; ".join(f"{a['workload']} {a['dtype']} ({a['peer_run']}) {a['agree']:.0%} of {a['tokens']}"
                          for a in agreement)
        lines += ["", f"Greedy agreement with vLLM, positionwise over the first output tokens of each request: {pairs}"]
    installs = report.get("installs", {})
    if installs:
        lines += ["", "Installs: " + "; ".join(
            f"{name} {'ok' if i['ok'] else 'FAILED'} (this run {i['this_run_s']:.0f} s"
            + (f", first install {sum(i['seconds'].values()):.0f} s" if i.get("seconds") else "") + ")"
            for name, i in installs.items())]
    return lines


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build(found: dict[str, tuple[Path, dict] | None]) -> str:
    """The Markdown tables of the latest results (``prefix -> (path, report) or None``); the peers section last."""
    lines = [f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), no GPU; "
             f"Python {platform.python_version()}. Each ratio compares with the peer measured in the same run.", "",
             "| Measure | This platform | Peer (same run) | Ratio | Target | Notes |",
             "|---|---|---|---|---|---|"]
    sources = []
    for prefix, command, rows in BENCHMARKS:
        if found[prefix] is None:
            lines.append(f"| `{command}` | not run | | | | |")
            continue
        path, report = found[prefix]
        sources.append(f"`{path.name}`")
        lines.extend("| " + " | ".join(row) + " |" for row in rows(report))
    lines += ["", "Sources: " + ", ".join(sources) if sources else "No results yet: run `make bench`."]
    lines += peers_table(found.get("peers"))
    lines += structured_table(found.get("structured"))
    lines += spec_decode_report.table(found.get("spec_decode"))
    return "\n".join(lines) + "\n"


def ratios_against_targets(found: dict[str, tuple[Path, dict] | None]) -> list[tuple[str, float, float, bool]]:
    """(label, value, target, higher is better) for the summary plot."""
    reports = {prefix: item[1] for prefix, item in found.items() if item is not None}
    out = []
    if report := reports.get("throughput"):
        r = report["ratios"]["wall"]
        out += [("engine / transformers static", r["engine_vs_best_static"], 2.5, True),
                ("engine / roofline", r["engine_vs_roofline"], 0.75, True)]
    if report := reports.get("multi-lora"):
        t = report["targets"]
        out += [("32 LoRA / base", t["throughput_32_uniform_vs_base"], 0.8, True),
                ("32 LoRA / PEFT", t["throughput_32_uniform_vs_peft"], 15.0, True),
                ("p99 TTFT skewed / uniform", t["ttft_p99_skewed_vs_uniform"], 3.0, False)]
    if report := reports.get("serve"):
        out.append(("server / offline", report["saturation_vs_offline"], report["target"], True))
    if report := reports.get("gateway"):
        out.append(("gateway tok/s / direct", 1 - report["blocks"]["throughput_c16"]["throughput_loss"], 0.9, True))
    if report := reports.get("structured"):
        for backend in report["backends"]:
            engine = report["summary"]["systems"].get(f"engine-{backend}") or []
            overhead = target_overhead(engine[-1].get("steps") or {}) if engine else None
            if overhead is not None:
                out.append((f"constrained / free step, batch {engine[-1]['batch']} ({backend})", 1 + overhead, 1.10,
                            False))
    if report := reports.get("peers"):
        out += [(r.get("short") or f"{r['workload']} {r['dtype']}: vs {r['peer_run']}", r["ratio"], r["target"],
                 r["higher_is_better"]) for r in report["summary"]["ratios"]
                if r["target"] is not None and r["ratio"] is not None]
    return out


def plot(points: list[tuple[str, float, float, bool]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.5 * len(points)))
    labels = [p[0] for p in points]
    scores = [(value / target) if higher else (target / value if value else 0) for _, value, target, higher in points]
    colors = ["tab:green" if s >= 1 else "tab:red" for s in scores]
    ax.barh(labels, scores, color=colors)
    ax.axvline(1.0, color="black", linewidth=1)
    for y, (_, value, target, higher) in enumerate(points):
        ax.text(0.02, y, f"{value:.2f} ({'>=' if higher else '<='} {target:g})", va="center", color="white")
    ax.set_xlabel("measured / target (1 = target met; right is better)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    found = {prefix: latest(prefix) for prefix, _, _ in BENCHMARKS}  # each result read once
    found["peers"] = latest("peers")
    table, points = build(found), ratios_against_targets(found)
    (RESULTS / "REPORT.md").write_text(table)
    if points:
        plot(points, RESULTS / "summary.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
