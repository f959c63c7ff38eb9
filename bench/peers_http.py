"""The servers of ``bench.peers`` and the HTTP client that loads them, all through ``/v1/completions``.

Servers (each a child process, given every core of this machine, logging to a file beside the results):
  * this engine: ``python -m engine serve FOLDER --dtype D --no-enable-lora``;
  * vLLM: ``vllm serve FOLDER --dtype D`` (its module ``vllm.entrypoints.openai.api_server``) from its own venv,
    with the CPU binding of the run's variant;
  * llama.cpp: ``llama-server -m MODEL.gguf`` with a KV cache of the model's type (f32 or bf16; its default is f16),
    ``-np`` slots and, for the adapter workload, every adapter loaded unapplied
    (``--lora ... --lora-init-without-apply``).
Client: streamed requests of token-id prompts, greedy, EOS ignored, usage reported; per request the time to the
first token (TTFT) and the time per output token after it (TPOT); either N streams each sending its share one after
the other, or everything at once (saturation). The client shares the cores with the server, the same for every peer.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.peers_install import llama_server, tail, vllm_folder

SERVED = "bench"


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str
    log: Path
    command: str = ""
    startup_s: float = 0.0
    extra_body: dict = field(default_factory=dict)  # what every request adds (llama-server's explicit lora list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc)  # whatever it started and left behind (vLLM's engine core and worker)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group of ``proc``, a child started with ``start_new_session=True``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cores() -> int:
    return len(os.sched_getaffinity(0))


def vllm_env(bind: str) -> dict:
    """vLLM's CPU settings: KV cache in GiB, its compile cache kept, and ``bind`` = ``all`` (every core) or
    ``default`` (its own choice, which reserves a core: one of two here)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"),
           "VLLM_CACHE_ROOT": str(vllm_folder() / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if bind == "all":
        ids = sorted(os.sched_getaffinity(0))
        contiguous = ids == list(range(ids[0], ids[-1] + 1))
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"{ids[0]}-{ids[-1]}" if contiguous else ",".join(map(str, ids))
    return env


def _wait_ready(server: Server, timeout: float) -> None:
    started = time.perf_counter()
    deadline = started + timeout
    while time.perf_counter() < deadline:
        if server.proc.poll() is not None:
            kill_group(server.proc)
            raise RuntimeError(f"{server.name} exited with code {server.proc.returncode} while starting:\n"
                               f"{tail(server.log)}")
        try:
            if httpx.get(f"{server.url}/v1/models", timeout=2).status_code == 200:
                server.startup_s = time.perf_counter() - started
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"{server.name} not ready within {timeout:.0f} s:\n{tail(server.log)}")


def _spawn(name: str, cmd: list[str], env: dict, port: int, log: Path, timeout: float, **kw) -> Server:
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                cwd=kw.pop("cwd", None), start_new_session=True)
    server = Server(name, proc, f"http://127.0.0.1:{port}", log, " ".join(cmd), **kw)
    _wait_ready(server, timeout)
    return server


def engine_server(python: str, root: Path, folder: Path, dtype: str, port: int, log: Path, timeout: float,
                  quantization: str | None = None) -> Server:
    cmd = [python, "-m", "engine", "serve", str(folder), "--port", str(port), "--served-model-name", SERVED,
           "--no-enable-lora"] + (["--quantization", quantization] if quantization else [])
    if "--dtype" in subprocess.run([python, "-m", "engine", "serve", "--help"], capture_output=True, text=True,
                                   cwd=root).stdout:
        cmd += ["--dtype", dtype]
    elif dtype != "float32":
        raise RuntimeError(f"engine serve has no --dtype option: cannot serve {dtype}")
    env = {"ENGINE_API_KEY": "", "PYTHONUNBUFFERED": "1"}
    return _spawn("engine", cmd, env, port, log, timeout, cwd=root)


def vllm_server(folder: Path, dtype: str, bind: str, port: int, log: Path, timeout: float) -> Server:
    """``vllm serve``'s own server module: the ``vllm`` command itself fails in the CPU build, whose distribution
    is named ``vllm-cpu`` (its CLI asks ``importlib.metadata.version("vllm")``)."""
    python = vllm_folder() / "venv" / "bin" / "python"
    cmd = [str(python), "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--dtype", dtype,
           "--port", str(port), "--host", "127.0.0.1", "--served-model-name", SERVED, "--generation-config", "vllm"]
    return _spawn("vllm", cmd, vllm_env(bind), port, log, timeout)


def llama_server_proc(gguf: Path, dtype: str, slots: int, ctx_per_slot: int, loras: list[Path], port: int, log: Path,
                      timeout: float) -> Server:
    kv = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    n = str(cores())
    cmd = [str(llama_server()), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-a", SERVED,
           "-t", n, "-tb", n, "-np", str(slots), "-c", str(slots * ctx_per_slot), "--kv-unified",
           "-ctk", kv, "-ctv", kv, "--no-webui"]
    for lora in loras:
        cmd += ["--lora", str(lora)]
    if loras:
        cmd.append("--lora-init-without-apply")
    # Always an explicit list: a request without one gets the server's global adapters.
    extra = {"lora": [{"id": i, "scale": 0.0} for i in range(max(len(loras), 1))]}
    return _spawn("llama.cpp", cmd, {}, port, log, timeout, extra_body=extra)


def llama_lora_list(num_loras: int, adapter: int | None) -> list[dict]:
    return [{"id": i, "scale": 1.0 if i == adapter else 0.0} for i in range(max(num_loras, 1))]


# ---- the client
@dataclass
class Result:
    ok: bool
    output_tokens: int
    ttft: float
    e2e: float
    error: str = ""


async def one_request(http: httpx.AsyncClient, prompt: list[int], max_tokens: int, extra: dict) -> Result:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    started = time.perf_counter()
    first, usage, events = None, None, 0
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Result(False, 0, 0.0, time.perf_counter() - started, f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("choices"):
                    events += 1
                    if first is None:
                        first = time.perf_counter()
                usage = event.get("usage") or usage
    except httpx.HTTPError as error:
        return Result(False, 0, 0.0, time.perf_counter() - started, repr(error))
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else events
    error = "" if tokens == max_tokens else f"{tokens} output tokens, expected {max_tokens}"
    return Result(not error, tokens, (first or end) - started, end - started, error)


def _ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "mean": None}
    array = np.asarray(values) * 1000
    return {"p50": float(np.percentile(array, 50)), "p90": float(np.percentile(array, 90)), "mean": float(array.mean())}


async def _load(url: str, prompts: list[list[int]], max_tokens: int, streams: int, extras: list[dict]) -> dict:
    queue = list(zip(prompts, extras, strict=True))
    results: list[Result] = []
    # No keep-alive: llama-server's HTTP library closes reused connections on its own schedule, and a request sent
    # on one it has just closed fails; a fresh loopback connection per request costs every system the same.
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as http:
        async def worker():
            while queue:
                prompt, extra = queue.pop(0)
                results.append(await one_request(http, prompt, max_tokens, extra))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        duration = time.perf_counter() - started
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {"streams": streams, "requests": len(results), "requests_ok": len(ok), "duration_s": duration,
            "tok_s": sum(r.output_tokens for r in results) / duration, "ttft_ms": _ms([r.ttft for r in ok]),
            "tpot_ms": _ms(tpots), "errors": sorted({r.error[:300] for r in results if not r.ok})[:5]}


def load(server: Server, prompts: list[list[int]], max_tokens: int, streams: int,
         extras: list[dict] | None = None, timeout: float = 1800) -> dict:
    """``streams`` concurrent streams share ``prompts`` (``streams >= len(prompts)``: all at once); the whole run
    is given ``timeout`` seconds."""
    extras = extras or [server.extra_body] * len(prompts)
    run = _load(server.url, prompts, max_tokens, min(streams, len(prompts)), extras)
    return asyncio.run(asyncio.wait_for(run, timeout))


def warm_up(server: Server, prompts: list[list[int]]) -> None:
    """Two short requests on reversed prompts (no prefix-cache hits later): first-request costs out of the runs."""
    load(server, [list(reversed(p)) for p in prompts[:2]], 4, 2)
