"""The servers of ``bench.spec_decode`` and its streamed-chat client.

Servers (child processes given every core, logging beside the results; ``bench.peers_http`` starts and stops them):
  * this engine: ``python -m engine serve MODEL --enable-lora --adapter-sources demo/adapters [--speculative-config
    JSON]``; the json-extractor adapter is named per request (the protocol's ``adapter`` field);
  * vLLM's CPU build: its OpenAI server with ``--enable-lora --lora-modules json-extractor=FOLDER`` (or without
    LoRA, when its speculative decoding refuses it) and ``--speculative-config JSON``.
Client: streamed ``/v1/chat/completions``, greedy, EOS honoured (real answers, of their own length), usage at the
end. TTFT is the time to the first chunk with text (vLLM sends an empty role chunk first), TPOT the time per output
token after it, as ``bench.peers_http`` counts them. Acceptance comes from the server's own counters, read before
and after each run: the engine's ``/stats`` ``speculative``, vLLM's ``vllm:spec_decode_*`` Prometheus counters.
"""

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench import peers_http as http
from bench.peers_install import vllm_python

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ROOT / "demo" / "adapters"
ADAPTER_NAME = "json-extractor"


@dataclass(frozen=True, slots=True)
class Job:
    """One chat request of workload (a): which prompt set, its messages, its output cap, with the adapter or not."""

    set: str  # "json" (the json-extractor adapter) or "edit" (the base model)
    messages: list
    max_tokens: int

    @property
    def uses_adapter(self) -> bool:
        return self.set == "json"


@dataclass(slots=True)
class Reply:
    ok: bool
    output_tokens: int
    ttft: float
    e2e: float
    text: str = ""
    error: str = ""


def engine_server(spec: dict | None, port: int, log: Path, timeout: float) -> http.Server:
    cmd = [sys.executable, "-m", "engine", "serve", "smollm2-135m-instruct", "--port", str(port),
           "--served-model-name", http.SERVED, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
           "--adapter-sources", str(ADAPTERS), "--kv-cache-memory", "1GiB"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    return http._spawn("engine", cmd, {"ENGINE_API_KEY": "", "PYTHONUNBUFFERED": "1"}, port, log, timeout, cwd=ROOT)


def vllm_server(folder: Path, dtype: str, spec: dict | None, lora: bool, port: int, log: Path,
                timeout: float) -> http.Server:
    cmd = [str(vllm_python()), "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--dtype",
           dtype, "--port", str(port), "--host", "127.0.0.1", "--served-model-name", http.SERVED,
           "--generation-config", "vllm"]
    if lora:
        cmd += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8",
                "--lora-modules", f"{ADAPTER_NAME}={ADAPTERS / ADAPTER_NAME}"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = {**http.vllm_env("all"), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    return http._spawn("vllm", cmd, env, port, log, timeout)


def request_body(job: Job, system: str) -> dict:
    """The chat request of ``job`` for ``system``: the engine names the adapter by id plus its source, vLLM by the
    name its ``--lora-modules`` gave it."""
    body = {"model": http.SERVED, "messages": job.messages, "max_tokens": job.max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if job.uses_adapter:
        if system == "engine":
            body.update(model=f"demo-{ADAPTER_NAME}", adapter={"id": f"demo-{ADAPTER_NAME}",
                                                                "uri": str(ADAPTERS / ADAPTER_NAME)})
        else:
            body["model"] = ADAPTER_NAME
    return body


async def one_chat(client: httpx.AsyncClient, body: dict) -> Reply:
    started = time.perf_counter()
    first, usage, pieces = None, None, []
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Reply(False, 0, 0.0, time.perf_counter() - started, error=f"HTTP {response.status_code}: "
                                                                                  f"{text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if content := (choice.get("delta") or {}).get("content"):
                        first = first or time.perf_counter()
                        pieces.append(content)
                usage = event.get("usage") or usage
    except httpx.HTTPError as error:
        return Reply(False, 0, 0.0, time.perf_counter() - started, error=repr(error))
    end = time.perf_counter()
    if not usage:
        return Reply(False, 0, 0.0, end - started, error="no usage in the stream")
    return Reply(True, usage["completion_tokens"], (first or end) - started, end - started, "".join(pieces))


def latency_summary(replies: list[Reply], duration: float) -> dict:
    """TTFT and TPOT (p50, p90, mean, ms) over the replies that succeeded; output tok/s over the run's wall time."""
    ok = [r for r in replies if r.ok]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {"requests": len(replies), "requests_ok": len(ok), "duration_s": duration,
            "output_tokens": sum(r.output_tokens for r in ok),
            "tok_s": sum(r.output_tokens for r in ok) / duration if duration else 0.0,
            "ttft_ms": _ms([r.ttft for r in ok]), "tpot_ms": _ms(tpots),
            "errors": sorted({r.error for r in replies if not r.ok})[:5]}


def _ms(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "mean": None}
    array = np.asarray(values) * 1000
    return {"p50": float(np.percentile(array, 50)), "p90": float(np.percentile(array, 90)), "mean": float(array.mean())}


async def _streams(url: str, bodies: list[dict], streams: int) -> tuple[list[Reply], float]:
    queue = list(enumerate(bodies))
    replies: list[Reply | None] = [None] * len(bodies)
    async with httpx.AsyncClient(base_url=url, timeout=1800,
                                 limits=httpx.Limits(max_connections=streams + 4)) as client:
        async def worker():
            while queue:
                index, body = queue.pop(0)
                replies[index] = await one_chat(client, body)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return replies, time.perf_counter() - started


def run_streams(server: http.Server, jobs: list[Job], streams: int, timeout: float) -> tuple[dict, list[str]]:
    """``streams`` concurrent streams share ``jobs``, each sending its next one when its last finished; the run's
    summary and the reply texts in the jobs' order."""
    bodies = [request_body(job, server.name) for job in jobs]
    replies, duration = asyncio.run(asyncio.wait_for(_streams(server.url, bodies, streams), timeout))
    return latency_summary(replies, duration), [r.text for r in replies]


def spec_counters(server: http.Server) -> dict | None:
    """Cumulative (drafted, accepted, verified drafts) of ``server``; None when it runs no speculation."""
    if server.name == "engine":
        spec = httpx.get(f"{server.url}/stats", timeout=30).json().get("speculative")
        if not spec:
            return None
        return {"drafted": spec["drafted_tokens"], "accepted": spec["accepted_tokens"],
                "drafts": spec["draft_steps"], "steps_skipped_batch": spec.get("steps_skipped_batch", 0)}
    return vllm_spec_counters(httpx.get(f"{server.url}/metrics", timeout=30).text)


_VLLM_COUNTERS = {"vllm:spec_decode_num_draft_tokens_total": "drafted",
                  "vllm:spec_decode_num_accepted_tokens_total": "accepted",
                  "vllm:spec_decode_num_drafts_total": "drafts"}


def vllm_spec_counters(metrics: str) -> dict | None:
    """vLLM's speculative-decoding counters from its Prometheus text, summed over label sets; None without them."""
    out = {}
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _VLLM_COUNTERS:
            out[_VLLM_COUNTERS[name]] = out.get(_VLLM_COUNTERS[name], 0) + float(line.rsplit(" ", 1)[1])
    return out if "drafted" in out and "accepted" in out else None


def acceptance(before: dict | None, after: dict | None) -> dict | None:
    """What one run added to the counters: drafted and accepted tokens, acceptance rate and mean accepted length
    (tokens kept per verified draft)."""
    if before is None or after is None:
        return None
    delta = {key: after[key] - before.get(key, 0) for key in after}
    drafted, accepted, drafts = delta["drafted"], delta["accepted"], delta.get("drafts", 0)
    return {**delta, "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": accepted / drafts if drafts else None}
