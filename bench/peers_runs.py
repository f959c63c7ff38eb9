"""One run of ``bench.peers``: a system on a workload at a precision, each in its own process with a time limit.

Every function returns a record ``{"system", "workload", "dtype", "variant", "ok", ...}``; a failure is a record with
``ok: false`` and the error's tail, never an exception, so that a peer that fails is reported, not dropped.
"""

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench import peers_http as http
from bench.peers_install import tail, vllm_python
from bench.peers_models import base_gguf, hf_copy, lora_ggufs

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "peers_offline.py"
LORA = {"max_loras": 8, "max_cpu_loras": 32, "max_lora_rank": 16}  # as bench.multi_lora (host tier holds all 32)
VARIANTS = {"all": "both cores", "default": "its default binding"}
INT8 = "int8 weights"  # this engine's variant with quantization="int8"
INT8_KV = "int8 weights and KV"  # and kv_cache_dtype="int8": its fastest mode where attention reads int8 in C


def record(system: str, workload: str, dtype: str, variant: str, **fields) -> dict:
    return {"system": system, "workload": workload, "dtype": dtype, "variant": variant, **fields}


def failed(base: dict, reason: str, detail: str = "") -> dict:
    """A failed run: ``reason`` one line for the tables, ``error`` the reason after the log's or traceback's tail."""
    lines = reason.strip().splitlines() or ["?"]
    return {**base, "ok": False, "reason": lines[0][:500], "error": (detail + "\n" + reason)[-4000:]}


def guarded(fn):
    """Run ``fn(base, ...)``; any exception becomes a failed record with its traceback's tail."""
    def wrapper(base: dict, *args, **kwargs) -> dict:
        started = time.perf_counter()
        try:
            out = fn(base, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - a peer's failure of any kind is a result
            out = failed(base, f"{type(error).__name__}: {error}", traceback.format_exc())
        out["elapsed_s"] = time.perf_counter() - started
        status = "ok" if out.get("ok") else "FAILED: " + out["reason"][:200]
        print(f"  {base['system']:9s} {base['workload']:8s} {base['dtype']:8s} {base['variant']}: {status}"
              + (f" {out['tok_s']:.1f} tok/s" if out.get("ok") and "tok_s" in out else ""), flush=True)
        return out
    return wrapper


# ---- offline LLM.generate (this engine, vLLM)
@guarded
def offline_driver(base: dict, model_folder: Path, prompts: list, output_tokens: int, logs: Path, timeout: float,
                   adapters: list[Path] | None = None, assignment: list | None = None,
                   warm_per_adapter: int = 0) -> dict:
    system, name = base["system"], f"{base['system']}-{base['workload']}-{base['dtype']}-{base['variant']}"
    name = name.replace(" ", "_")
    spec = {"backend": "engine" if system == "engine" else "vllm", "dtype": base["dtype"], "prompts": prompts,
            "output_tokens": output_tokens, "out": str(logs / f"{name}.result.json"),
            "model": str(model_folder if system == "engine" else hf_copy(model_folder))}
    for key in ("quantization", "kv_cache_dtype"):
        if base.get(key):
            spec[key] = base[key]
    if adapters:
        spec.update(adapters=[str(a) for a in adapters], assignment=assignment, lora=LORA)
    if base["workload"] == "adapters":  # as bench.multi_lora: no prefix cache, with or without adapters
        spec.update(warm_per_adapter=warm_per_adapter, prefix_caching=False)
    spec_path, log = logs / f"{name}.spec.json", logs / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    if system == "engine":
        cmd, env = [sys.executable, "-P", str(DRIVER), str(spec_path)], {"PYTHONPATH": str(ROOT)}
    else:
        cmd, env = [str(vllm_python()), "-P", str(DRIVER), str(spec_path)], http.vllm_env(base["bind"])
        base = {**base, "vllm_env": {k: v for k, v in env.items() if k.startswith("VLLM_CPU")}}
    with log.open("wb") as out:  # its own process group: on a timeout vLLM's engine and worker processes go too
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT,
                                start_new_session=True)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        http.kill_group(proc)
        return failed(base, f"timed out after {timeout:.0f} s (log {log})", tail(log))
    if code != 0 or not Path(spec["out"]).exists():
        last = (tail(log, 1).strip() or "no output")[:300]
        return failed(base, f"exit code {code}: {last} (log {log})", tail(log))
    return {**base, **json.loads(Path(spec["out"]).read_text()), "log": str(log)}


# ---- llama-server at saturation (it has no offline API: everything sent at once over HTTP)
@guarded
def llama_saturation(base: dict, model_folder: Path, prompts: list, output_tokens: int, logs: Path, timeout: float,
                     adapters: list[Path] | None = None, assignment: list | None = None, slots: int = 64) -> dict:
    dtype = base["dtype"]
    gguf = base_gguf(model_folder, dtype)
    loras = lora_ggufs(model_folder, adapters, dtype) if adapters else []
    ctx = max(len(p) for p in prompts) + output_tokens + 16
    log = logs / f"llama-{base['workload']}-{dtype}.server.log"
    server = http.llama_server_proc(gguf, dtype, min(slots, len(prompts)), ctx, loras, http.free_port(), log, timeout)
    try:
        http.warm_up(server, prompts)
        extras = None
        if loras:
            extras = [{"lora": http.llama_lora_list(len(loras), a)} for a in assignment]
        run = http.load(server, prompts, output_tokens, len(prompts), extras, timeout=timeout)
    finally:
        server.stop()
    if run["requests_ok"] != len(prompts):
        return failed(base, f"{len(prompts) - run['requests_ok']} requests failed: {run['errors']}; log {log}")
    return {**base, "ok": True, "tok_s": run["tok_s"], "wall_s": run["duration_s"], "startup_s": server.startup_s,
            "requests": len(prompts), "slots": min(slots, len(prompts)), "gguf": gguf.name, "log": str(log),
            "via": "HTTP, all requests at once", "command": server.command}


# ---- streams over HTTP (all three systems)
@guarded
def streams(base: dict, model_folder: Path, prompts_by_streams: dict[int, list], output_tokens: int, logs: Path,
            timeout: float) -> dict:
    """One server; for each stream count its prompts, each stream sending its share one after the other. The record
    holds one run per stream count (``runs``)."""
    system, dtype = base["system"], base["dtype"]
    port = http.free_port()
    log = logs / f"{system}-streams-{dtype}-{base['variant']}.server.log".replace(" ", "_")
    if system == "engine":
        server = http.engine_server(sys.executable, ROOT, model_folder, dtype, port, log, timeout,
                                    quantization=base.get("quantization"))
    elif system == "vllm":
        base = {**base, "vllm_env": {k: v for k, v in http.vllm_env(base["bind"]).items() if k.startswith("VLLM_CPU")}}
        server = http.vllm_server(hf_copy(model_folder), dtype, base["bind"], port, log, timeout)
    else:
        slots = max(prompts_by_streams)
        ctx = max(len(p) for ps in prompts_by_streams.values() for p in ps) + output_tokens + 16
        server = http.llama_server_proc(base_gguf(model_folder, dtype), dtype, slots, ctx, [], port, log, timeout)
    try:
        http.warm_up(server, next(iter(prompts_by_streams.values())))
        runs = {str(n): http.load(server, prompts, output_tokens, n, timeout=timeout)
                for n, prompts in prompts_by_streams.items()}
    finally:
        server.stop()
    bad = {n: r["errors"] for n, r in runs.items() if r["requests_ok"] != r["requests"]}
    if bad:
        return failed(base, f"failed requests: {bad}; log {log}")
    return {**base, "ok": True, "startup_s": server.startup_s, "runs": runs, "log": str(log),
            "command": server.command}
