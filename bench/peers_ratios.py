"""The ratios of ``bench.peers``: this engine against each peer run of the same workload and precision, same run.

Each ratio names the two runs it came from (system, variant, precision) so the report can print it beside them.
Throughput ratios are engine / peer (higher is better for the engine); latency ratios are engine / peer too, where
lower is better. Targets are TARGETS below; a ratio without one is shown for information.
"""

TARGETS = {("offline", "vllm"): 1.25, ("adapters", "vllm"): 3.0, ("adapters", "engine"): 0.9,
           ("streams-1", "llama"): 1.0}


def _ok(runs: list[dict], **match) -> list[dict]:
    return [r for r in runs if r.get("ok") and all(r.get(k) == v for k, v in match.items())]


NAMES = {"engine": "this engine", "vllm": "vLLM", "llama": "llama.cpp"}
SHORT = {"engine": "own base", "vllm": "vLLM", "llama": "llama.cpp", "float32": "fp32", "bfloat16": "bf16"}


def _label(run: dict) -> str:
    return f"{NAMES[run['system']]} ({run['variant']})"


def _entry(workload, dtype, engine, peer, measure, mine, theirs, higher, target=None) -> dict:
    ratio = mine / theirs if theirs else None
    met = None if target is None or ratio is None else (ratio >= target if higher else ratio <= target)
    what = "tok/s" if measure.startswith("output") else measure.split()[0]
    short = f"{workload} {SHORT.get(dtype, dtype)}{' int8' if engine.get('quantization') else ''} {what}: " \
            f"vs {SHORT[peer['system']]}"
    return {"workload": workload, "dtype": dtype, "measure": measure, "short": short, "engine_run": _label(engine),
            "peer_run": _label(peer) + ("" if peer["dtype"] == dtype else f", {peer['dtype']}"),
            "engine": mine, "peer": theirs, "ratio": ratio, "higher_is_better": higher, "target": target, "met": met}


def summarize(runs: list[dict]) -> dict:
    ratios = []
    for dtype in sorted({r["dtype"] for r in runs}):
        for workload in ("offline", "adapters"):
            mine = _ok(runs, system="engine", workload=workload, dtype=dtype, variant="both cores")
            if not mine:
                continue
            engine = mine[0]
            for peer in _ok(runs, workload=workload, dtype=dtype):
                if peer is engine or peer.get("quantization"):  # the int8 mode is in "best against best"
                    continue
                key = (workload, peer["system"])
                target = TARGETS.get(key) if peer["variant"] in ("both cores", "base model only") else None
                ratios.append(_entry(workload, dtype, engine, peer, "output tok/s", engine["tok_s"], peer["tok_s"],
                                     True, target))
        # this engine as it is (the targets) and with int8 weights (its fastest mode, for information)
        for mine in _ok(runs, system="engine", workload="streams", dtype=dtype):
            for peer in _ok(runs, workload="streams", dtype=dtype):
                if peer["system"] == "engine":
                    continue
                for n, run in peer["runs"].items():
                    own = mine["runs"].get(n)
                    if own is None:
                        continue
                    for metric in ("tpot_ms", "ttft_ms"):
                        target = TARGETS.get((f"streams-{n}", peer["system"])) \
                            if metric == "tpot_ms" and mine["variant"] == "both cores" else None
                        ratios.append(_entry(f"streams-{n}", dtype, mine, peer, f"{metric[:4].upper()} p50 ms",
                                             own[metric]["p50"], run[metric]["p50"], False, target))
                    ratios.append(_entry(f"streams-{n}", dtype, mine, peer, "output tok/s", own["tok_s"],
                                         run["tok_s"], True))
    best = {}
    for system in ("engine", "vllm", "llama"):
        candidates = _ok(runs, system=system, workload="offline")
        if candidates:
            top = max(candidates, key=lambda r: r["tok_s"])
            best[system] = {"tok_s": top["tok_s"], "dtype": top["dtype"], "variant": top["variant"]}
    if "engine" in best and "vllm" in best:
        e, v = best["engine"], best["vllm"]
        ratios.append({"workload": "offline, best against best", "dtype": f"{e['dtype']} / {v['dtype']}",
                       "measure": "output tok/s", "short": "offline best: vs vLLM best",
                       "engine_run": f"this engine ({e['variant']}, {e['dtype']})",
                       "peer_run": f"vLLM ({v['variant']}, {v['dtype']})", "engine": e["tok_s"], "peer": v["tok_s"],
                       "ratio": e["tok_s"] / v["tok_s"], "higher_is_better": True, "target": 2.0,
                       "met": e["tok_s"] / v["tok_s"] >= 2.0})
    agreement = []
    for engine in _ok(runs, system="engine", variant="both cores"):
        for peer in _ok(runs, system="vllm", workload=engine["workload"], dtype=engine["dtype"]):
            if engine.get("first_tokens") and peer.get("first_tokens"):
                pairs = [(a, b) for x, y in zip(engine["first_tokens"], peer["first_tokens"], strict=False)
                         for a, b in zip(x, y, strict=False)]
                agreement.append({"workload": engine["workload"], "dtype": engine["dtype"],
                                  "peer_run": _label(peer), "tokens": len(pairs),
                                  "agree": sum(a == b for a, b in pairs) / len(pairs) if pairs else None})
    failures = [{"system": r["system"], "workload": r["workload"], "dtype": r["dtype"], "variant": r["variant"],
                 "reason": r.get("reason", ""), "error": r.get("error", "")[-600:]} for r in runs if not r.get("ok")]
    order = ["offline", "adapters", "streams-1", "streams-4"]
    ratios.sort(key=lambda r: (order.index(r["workload"]) if r["workload"] in order else len(order), r["dtype"]))
    return {"ratios": ratios, "best_offline": best, "agreement": agreement, "failures": failures,
            "lines": _lines(ratios, failures) + [
                f"greedy agreement with {a['peer_run']}, {a['workload']} {a['dtype']}: {a['agree']:.0%} of the first "
                f"{a['tokens']} output tokens (positionwise)" for a in agreement if a["agree"] is not None]}


def _lines(ratios: list[dict], failures: list[dict]) -> list[str]:
    out = []
    for r in ratios:
        target = "" if r["target"] is None else f" (target {'>=' if r['higher_is_better'] else '<='} {r['target']:g}" \
                                                 f": {'met' if r['met'] else 'NOT met'})"
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        out.append(f"{r['workload']:>9s} {r['dtype']:>8s} {r['measure']}: {r['engine_run']} {r['engine']:.1f} / "
                   f"{r['peer_run']} {r['peer']:.1f} = {ratio}{target}")
    for f in failures:
        out.append(f"FAILED {f['system']} {f['workload']} {f['dtype']} ({f['variant']}): {f['reason'][:300]}")
    return out
