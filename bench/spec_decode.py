"""Speculative decoding without a draft model: speculation on (n-gram, suffix) against off, through the engine
server and offline, beside vLLM's CPU build with its n-gram proposer, in the same run.

``python -m bench.spec_decode [--quick] [--systems engine,vllm] [--methods ngram,suffix] [--batches 1,2,...]
[--no-offline] [--timeout S]``

SmolLM2-135M-Instruct, dtype auto (vLLM at the dtype that gives here), greedy, EOS honoured (real answers).
Workloads:
  (a) input-grounded: the ``json-extractor`` demo adapter on its held-out prompts (``bench.demo_data``, max_tokens
      64) and "repeat this paragraph, changing X to Y" on the base model (``bench.edit_paragraphs``, max_tokens 192,
      ``--quick`` 160);
  (b) ``bench.throughput``'s offline workload (random-token prompts of 16-256 tokens, EOS ignored), all at once.
Speculation: ``ngram`` k=4 (``prompt_lookup_max`` 4: 4-grams only, here as in vLLM, which gets the same dict),
``suffix`` k=5; engine defaults otherwise (``max_batch_size`` 32, ``min_acceptance_rate`` 0.25,
``suffix_decoding_max_spec_factor`` unset).

Measured:
  * (a) through the server, streamed chat: one stream, then four streams (on other prompts of each set, so no
    run drafts from an earlier run's answers), TTFT and TPOT p50 and output tok/s per set, with the acceptance
    rate and mean accepted length (drafted tokens kept per verified draft) of that run from the server's counters.
    This engine's servers (off and one per method) run side by side and take turns on every run; vLLM's (off, then
    its ``ngram`` with ``num_speculative_tokens`` 4 and ``prompt_lookup_max`` 4) one after the other, with the
    adapter through ``--enable-lora --lora-modules``, or, when its speculative decoding refuses LoRA, on the
    paragraph set alone (the refusal is a result, with its log's tail). Whether each speculative run's replies are
    identical to the run without is checked (greedy speculation is exact).
  * (a) offline (``LLM.generate`` with the chat template) at batch 1, 2, 4, 8, 16, 32 (``bench.spec_decode_offline``,
    the step's ``max_batch_size`` cut lifted): output tok/s on / off per method. The smallest batch where the ratio
    falls under 1 is the crossover, against ``SpeculativeConfig.max_batch_size``'s default.
  * (b) offline at saturation: output tok/s on / off (target: no worse than -3%), and on without the cut, after
    an untimed run of each setting on other prompts of the same shape; 3 rounds (``--quick``: 1), the settings
    interleaved in a rotated order each round, each run under its own cache salt, tokens and wall time summed.
Results: ``bench/results/spec_decode-<time>.json`` (rewritten after each stage; server logs beside it);
``python -m bench.report`` puts them in its "Speculative decoding" table. Other work may share the cores: compare
figures within one run.
"""

import argparse
import json
import os
import time
import traceback
from pathlib import Path

from bench import peers_http as http
from bench import spec_decode_http as chat
from bench.demo_data import eval_cases
from bench.edit_paragraphs import edit_cases
from bench.peers_install import install_vllm, tail
from bench.spec_decode_http import Job

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = ("engine", "vllm")
METHODS = {"ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
           "suffix": {"method": "suffix", "num_speculative_tokens": 5}}
VLLM_SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
BATCHES = (1, 2, 4, 8, 16, 32)
TARGETS = {"tpot_speedup_1": 2.0, "tpot_speedup_4": 1.5, "saturation_ratio": 0.97}


def settings(quick: bool) -> dict:
    """How many prompts of each set each stream count gets (disjoint slices), output caps, sweep sizes."""
    if quick:
        return {"json": {1: 6, 4: 12}, "edit": {1: 4, 4: 8}, "max_tokens": {"json": 64, "edit": 160},
                "sweep_requests": "one per seat, at least 2", "saturation_rounds": 1, "timeout": 900}
    return {"json": {1: 8, 4: 15}, "edit": {1: 5, 4: 10}, "max_tokens": {"json": 64, "edit": 192},
            "sweep_requests": "two per seat, at most the 40 prompts", "saturation_rounds": 3,
            "timeout": 1800}


def all_jobs(s: dict) -> dict[str, list[Job]]:
    json_jobs = [Job("json", c.messages, s["max_tokens"]["json"]) for c in eval_cases("json-extractor")]
    edit_jobs = [Job("edit", c.messages, s["max_tokens"]["edit"]) for c in edit_cases()]
    return {"json": json_jobs, "edit": edit_jobs}


def server_runs(s: dict, jobs: dict[str, list[Job]], sets: tuple[str, ...] = ("json", "edit")) -> list[dict]:
    """The server runs in order: each set at one stream, then at four, on disjoint slices of its prompts."""
    runs = []
    for streams in (1, 4):
        for name in sets:
            start = 0 if streams == 1 else s[name][1]
            runs.append({"set": name, "streams": streams, "jobs": jobs[name][start:start + s[name][streams]]})
    return runs


def sweep_jobs(jobs: dict[str, list[Job]], batch: int, quick: bool) -> list[Job]:
    """Workload (a) for one batch size: both sets interleaved, more requests than seats (full) so the batch stays
    full as requests finish."""
    json_jobs, edit_jobs = jobs["json"], jobs["edit"]
    pairs = zip(json_jobs[:len(edit_jobs)], edit_jobs, strict=True)
    mixed = [j for pair in pairs for j in pair] + json_jobs[len(edit_jobs):]
    count = max(batch, 2) if quick else min(2 * batch, len(mixed))
    return mixed[:count]


def failed(reason: str, detail: str = "") -> dict:
    lines = reason.strip().splitlines() or ["?"]
    return {"ok": False, "reason": lines[0][:500], "error": (detail + "\n" + reason)[-4000:]}


def identical_share(texts: list, reference: list) -> float | None:
    """The share of replies equal to the reference run's (None when there is nothing to compare)."""
    pairs = [(a, b) for a, b in zip(texts, reference, strict=True) if a is not None and b is not None]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


# ---- workload (a) through the servers
def measure_servers(servers: dict[str, http.Server], runs: list[dict], timeout: float) -> dict:
    """Every run on every server in turn; per server and run its latency summary, acceptance and replies."""
    out = {name: {"ok": True, "runs": []} for name in servers}
    for run in runs:
        for name, server in servers.items():
            before = chat.spec_counters(server)
            summary, texts = chat.run_streams(server, run["jobs"], run["streams"], timeout)
            out[name]["runs"].append({"set": run["set"], "streams": run["streams"], **summary,
                                      "acceptance": chat.acceptance(before, chat.spec_counters(server)),
                                      "texts": texts})
            print(f"  {server.name:6s} {name:7s} {run['set']:4s} x{run['streams']}: TPOT p50 "
                  f"{summary['tpot_ms']['p50'] or 0:.1f} ms, {summary['tok_s']:.1f} tok/s", flush=True)
    for name, record in out.items():
        record["startup_s"], record["command"] = servers[name].startup_s, servers[name].command
        if name != "off" and "off" in out:
            for run, reference in zip(record["runs"], out["off"]["runs"], strict=True):
                run["identical_to_off"] = identical_share(run["texts"], reference["texts"])
    return out


def warm(server: http.Server, jobs: dict[str, list[Job]], sets: tuple[str, ...]) -> None:
    """A short request per set (adapter load, first steps) on the last prompt of each, which no run uses."""
    chat.run_streams(server, [Job(name, jobs[name][-1].messages, 4) for name in sets], 1, 600)


def engine_servers(configs: dict[str, dict | None], s: dict, jobs: dict, logs: Path) -> dict:
    servers, out = {}, {}
    try:
        for name, spec in configs.items():
            try:
                servers[name] = chat.engine_server(spec, http.free_port(), logs / f"engine-{name}.server.log",
                                                   s["timeout"])
                warm(servers[name], jobs, ("json", "edit"))
            except Exception as error:  # noqa: BLE001 - a server that fails to start is a result
                out[name] = failed(f"{type(error).__name__}: {error}", traceback.format_exc())
        out.update(measure_servers(servers, server_runs(s, jobs), s["timeout"]))
    finally:
        for server in servers.values():
            server.stop()
    return out


def vllm_servers(s: dict, jobs: dict, dtype: str, logs: Path) -> dict:
    """vLLM off, then with its n-gram proposer; each with the adapter, or (speculation refusing LoRA) without."""
    from bench.peers_models import hf_copy

    try:
        install_vllm()
        folder = hf_copy(_model_folder())
    except Exception as error:  # noqa: BLE001 - a peer that cannot be installed is a result
        return {"off": failed(f"vLLM install: {type(error).__name__}: {error}", traceback.format_exc())}
    out = {}
    for name, spec in (("off", None), ("ngram", VLLM_SPEC)):
        out[name] = _vllm_one(name, spec, True, s, jobs, dtype, folder, logs)
        if not out[name]["ok"] and spec is not None:
            out[f"{name}-no-lora"] = _vllm_one(name, spec, False, s, jobs, dtype, folder, logs)
    if "ngram-no-lora" in out and out["ngram-no-lora"]["ok"] and out["off"]["ok"]:
        edits = [r for r in out["off"]["runs"] if r["set"] == "edit"]
        for run, reference in zip(out["ngram-no-lora"]["runs"], edits, strict=True):
            run["identical_to_off"] = identical_share(run["texts"], reference["texts"])
    elif out["ngram"]["ok"] and out["off"]["ok"]:
        for run, reference in zip(out["ngram"]["runs"], out["off"]["runs"], strict=True):
            run["identical_to_off"] = identical_share(run["texts"], reference["texts"])
    return out


def _vllm_one(name: str, spec: dict | None, lora: bool, s: dict, jobs: dict, dtype: str, folder: Path,
              logs: Path) -> dict:
    sets = ("json", "edit") if lora else ("edit",)
    log = logs / f"vllm-{name}{'' if lora else '-no-lora'}.server.log"
    server = None
    try:
        server = chat.vllm_server(folder, dtype, spec, lora, http.free_port(), log, s["timeout"])
        warm(server, jobs, sets)
        record = measure_servers({name: server}, server_runs(s, jobs, sets), s["timeout"])[name]
        return {**record, "lora": lora, "log": str(log)}
    except Exception as error:  # noqa: BLE001 - a peer that fails is a result with its log's tail
        return {**failed(f"{type(error).__name__}: {error}", tail(log)), "lora": lora, "log": str(log)}
    finally:
        if server is not None:
            server.stop()


def _model_folder() -> Path:
    from engine.llm_engine import resolve_model_folder

    return Path(resolve_model_folder("smollm2-135m-instruct"))


# ---- offline: the batch sweep on (a) and saturation on (b)
def measure_offline(configs: dict[str, dict | None], jobs: dict, quick: bool, batches: tuple[int, ...],
                    rounds: int = 1) -> dict:
    from bench import spec_decode_offline as offline
    from bench.throughput import make_workload

    llms = {name: offline.make_llm(spec) for name, spec in configs.items()}
    for llm in llms.values():
        offline.warm_up(llm, jobs["json"] + jobs["edit"])
    sweep = []
    for batch in batches:
        row = {"batch": batch}
        for name, llm in llms.items():
            offline.set_cut(llm, offline.NO_CUT)
            row[name] = _offline_record(offline.chat_batch(llm, sweep_jobs(jobs, batch, quick), batch,
                                                           f"sweep-{batch}"), row.get("off"))
        sweep.append(row)
        print(f"  offline batch {batch}: " + ", ".join(f"{n} {row[n]['tok_s']:.1f}" for n in llms) + " tok/s",
              flush=True)
    vocab_size = llms["off"].llm_engine.model_config.vocab_size
    workload = make_workload(quick, vocab_size)
    # Untimed, on other prompts of the same shape: the first run of a workload builds oneDNN's primitive for every
    # new step size (drafts make many), about 2 s of the quick run here, which the first timed setting paid alone.
    warm = make_workload(quick, vocab_size, seed=1)
    for llm in llms.values():
        offline.set_cut(llm, None)
        offline.generate_saturated(llm, warm.prompts, warm.output_tokens, "saturation-warm")
    saturation = {}
    for cut in (None, offline.NO_CUT):
        names = [name for name in llms if cut is None or name != "off"]
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for round_ in range(rounds):
            # Interleaved, the order rotated every round, each run under its own salt: a slow stretch of the
            # machine falls on every setting alike, and no run reads another's prefix cache or suffix trees.
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                offline.set_cut(llms[name], cut)
                key = name if cut is None else f"{name}-no-cut"
                runs[name].append(offline.generate_saturated(llms[name], workload.prompts, workload.output_tokens,
                                                             f"saturation-{key}-{round_}"))
        for name in names:
            key = name if cut is None else f"{name}-no-cut"
            saturation[key] = _offline_record(_combined(runs[name]), saturation.get("off"))
            print(f"  offline saturation {key}: {saturation[key]['tok_s']:.1f} tok/s (rounds: "
                  + ", ".join(f"{t:.1f}" for t in saturation[key]["round_tok_s"]) + ")", flush=True)
    return {"sweep": sweep, "saturation": saturation, "saturation_rounds": rounds,
            "saturation_workload": {"requests": workload.num_requests, "output_tokens": workload.output_tokens,
                                    "prompt_tokens": [workload.min_prompt, workload.max_prompt]}}


def _combined(runs: list[dict]) -> dict:
    """One setting's saturation rounds as one run: tokens and wall time summed, the counters from before its first
    round to after its last, the first round's token ids (every round computes the same greedy tokens)."""
    tokens, wall = sum(r["output_tokens"] for r in runs), sum(r["wall_s"] for r in runs)
    return {"requests": sum(r["requests"] for r in runs), "output_tokens": tokens, "wall_s": wall,
            "tok_s": tokens / wall, "round_tok_s": [r["tok_s"] for r in runs],
            "counters": (runs[0]["counters"][0], runs[-1]["counters"][1]), "token_ids": runs[0]["token_ids"]}


def _offline_record(run: dict, off: dict | None) -> dict:
    token_ids = run.pop("token_ids")
    before, after = run.pop("counters")
    run["acceptance"] = chat.acceptance(before, after)
    if off is not None:
        run["identical_to_off"] = identical_share(token_ids, off["_token_ids"])
    else:
        run["_token_ids"] = token_ids
    return run


# ---- the summary
def tpot_speedup(off: dict, on: dict) -> float | None:
    """TPOT p50 off / on: above 1 when speculation makes each stream faster."""
    a, b = off["tpot_ms"]["p50"], on["tpot_ms"]["p50"]
    return a / b if a and b else None


def summarize(server: dict, offline: dict | None) -> dict:
    """Per system and speculative config, each run's TPOT speedup over the same system's run without; the sweep's
    ratios and crossover per method; the saturation ratios; each against its target."""
    out = {"tpot_speedup": [], "sweep_ratios": {}, "crossover": {}, "saturation_ratio": {}}
    for system, records in server.items():
        off = records.get("off") or {}
        for name, record in records.items():
            if name == "off" or not record.get("ok") or not off.get("ok"):
                continue
            reference = {(r["set"], r["streams"]): r for r in off["runs"]}
            for run in record["runs"]:
                speedup = tpot_speedup(reference[run["set"], run["streams"]], run)
                target = TARGETS[f"tpot_speedup_{run['streams']}"]
                out["tpot_speedup"].append({"system": system, "config": name, "set": run["set"],
                                            "streams": run["streams"], "speedup": speedup, "target": target,
                                            "met": speedup is not None and speedup >= target})
    if offline:
        methods = [k for k in offline["sweep"][0] if k not in ("batch", "off")]
        for method in methods:
            ratios = {row["batch"]: row[method]["tok_s"] / row["off"]["tok_s"] for row in offline["sweep"]}
            out["sweep_ratios"][method] = ratios
            out["crossover"][method] = crossover(ratios)
        off = offline["saturation"]["off"]["tok_s"]
        for name, run in offline["saturation"].items():
            if name != "off":
                ratio = run["tok_s"] / off
                out["saturation_ratio"][name] = {"ratio": ratio, "target": TARGETS["saturation_ratio"],
                                                 "met": ratio >= TARGETS["saturation_ratio"]}
    return out


def crossover(ratios: dict[int, float]) -> int | None:
    """The smallest batch size from which speculation no longer pays (ratio under 1 there and at every larger
    batch measured); None when it pays at every size."""
    sizes = sorted(ratios)
    for i, size in enumerate(sizes):
        if all(ratios[s] < 1 for s in sizes[i:]):
            return size
    return None


def strip_private(value):
    """The report without the reference token ids kept for the identity checks."""
    if isinstance(value, dict):
        return {k: strip_private(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list):
        return [strip_private(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer prompts per run (about 15 minutes on 2 cores)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes of the offline sweep")
    parser.add_argument("--no-offline", dest="offline", action="store_false",
                        help="skip the offline stage (the batch sweep and saturation): the servers only")
    parser.add_argument("--timeout", type=float, help="seconds a server may take to start or a run to finish")
    args = parser.parse_args(argv)
    systems, methods = _names(args.systems, SYSTEMS, parser), _names(args.methods, tuple(METHODS), parser)
    s = settings(args.quick)
    if args.timeout:
        s["timeout"] = args.timeout
    from bench.structured import resolved_dtype

    dtype = resolved_dtype("smollm2-135m-instruct")
    configs = {"off": None, **{m: METHODS[m] for m in methods}}
    jobs = all_jobs(s)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path, logs = RESULTS / f"spec_decode-{stamp}.json", RESULTS / f"spec_decode-{stamp}-logs"
    logs.mkdir(exist_ok=True)
    report = {"quick": args.quick, "dtype": dtype, "settings": s, "configs": configs, "vllm_spec": VLLM_SPEC,
              "machine": {"cores": http.cores(), "cpu": _cpu(), "load_avg_start": list(os.getloadavg())},
              "server": {}, "offline": None, "stages_s": {}}
    stages = [("offline", lambda: report.__setitem__("offline", measure_offline(
                  configs, jobs, args.quick, tuple(int(b) for b in args.batches.split(",")),
                  s["saturation_rounds"]))),
              ("engine", lambda: report["server"].__setitem__("engine", engine_servers(configs, s, jobs, logs))),
              ("vllm", lambda: report["server"].__setitem__("vllm", vllm_servers(s, jobs, dtype, logs)))]
    for name, stage in stages:
        if (name in ("engine", "vllm") and name not in systems) or (name == "offline" and not args.offline):
            continue
        print(f"{name}:", flush=True)
        started = time.perf_counter()
        stage()
        report["stages_s"][name] = time.perf_counter() - started
        report["summary"] = summarize(report["server"], report["offline"])
        report["machine"]["load_avg_end"] = list(os.getloadavg())
        path.write_text(json.dumps(strip_private(report), indent=1))
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {path}")
    return report


def _names(value: str, known: tuple[str, ...], parser) -> list[str]:
    names = [v for v in value.split(",") if v]
    if unknown := sorted(set(names) - set(known)):
        parser.error(f"unknown {unknown}; known: {', '.join(known)}")
    return names


def _cpu() -> str:
    from bench.report import cpu_model

    return cpu_model()


if __name__ == "__main__":
    main()
