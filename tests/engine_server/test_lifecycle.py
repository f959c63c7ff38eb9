"""Backpressure and graceful shutdown of the engine server."""

import asyncio
import json
import signal
import threading
import time

import httpx

from devstack.services import port_open
from tests.engine_server.conftest import start_engine


def test_full_waiting_queue_answers_503_with_retry_after(tiny_model_dir, tmp_path):
    server = start_engine(tiny_model_dir, tmp_path, "--no-enable-lora", "--max-num-seqs", "1",
                          "--max-waiting", "2")
    try:
        async def one(http, i):
            body = {"model": "tiny", "prompt": f"cat {i}", "max_tokens": 80, "ignore_eos": True}
            return await http.post("/v1/completions", json=body)

        async def run():
            headers = {"Authorization": f"Bearer {server.api_key}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
                return await asyncio.gather(*(one(http, i) for i in range(12)))

        responses = asyncio.run(run())
        refused = [r for r in responses if r.status_code == 503]
        served = [r for r in responses if r.status_code == 200]
        assert refused and served and len(refused) + len(served) == 12
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "overloaded" for r in refused)
        assert all(r.json()["usage"]["completion_tokens"] == 80 for r in served)
    finally:
        server.group.stop()


def test_sigterm_lets_in_flight_streams_finish_then_exits(tiny_model_dir, tmp_path):
    max_tokens = 400  # of the 512 the server allows: it streams long after the server stops accepting connections
    server = start_engine(tiny_model_dir, tmp_path, "--no-enable-lora", "--shutdown-grace", "20")
    proc = server.group.children[0].proc
    port = int(server.url.rsplit(":", 1)[1])
    lines: list[str] = []
    first_chunk = threading.Event()

    def consume():
        body = {"model": "tiny", "prompt": "sun and moon", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with server.client() as http, http.stream("POST", "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    reader = threading.Thread(target=consume)
    try:
        reader.start()
        assert first_chunk.wait(30)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while port_open("127.0.0.1", port):  # it stops accepting new connections at once...
            assert time.monotonic() < deadline, "still accepting connections 10 s after SIGTERM"
            time.sleep(0.02)
        assert reader.is_alive() and proc.poll() is None  # ...while the stream it serves goes on
        reader.join(30)
        assert lines[-1] == "data: [DONE]"
        usage = json.loads(lines[-2][len("data: "):])["usage"]
        assert usage["completion_tokens"] == max_tokens
        # uvicorn re-raises the signal once it has shut down cleanly, so the exit status is SIGTERM's.
        assert proc.wait(30) in (0, -signal.SIGTERM)
        log = server.group.children[0].log_path.read_text()
        assert "Application shutdown complete" in log and "Traceback" not in log
    finally:
        server.group.stop()
