"""An engine replica dies mid-run: its streams end with a clean error and are metered for what they relayed; new
requests go to the replica still up.

The test brings its own replica to kill and its own gateway process over [one of the stack's engines, that
replica], so the shared stack keeps both of its engines."""

import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from devstack.processes import ProcessGroup, python
from devstack.services import free_port
from tests.gateway.helpers import tenant_with_key, usage_rows
from tests.stack import engine_argv

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
NUM_STREAMS = 6
MAX_TOKENS = 400


@pytest.fixture
def gateway_with_a_spare_engine(stack, tmp_path):
    """(gateway URL, the spare engine's process, its URL): a gateway over stack.engine_urls[0] and a new engine."""
    model_dir = Path(stack.env["BASE_MODEL_CONFIG"]).parent
    engine_port, web_port = free_port(), free_port()
    spare_url = f"http://127.0.0.1:{engine_port}"
    env = {**stack.env, "ENGINE_URLS": f"{stack.engine_urls[0]},{spare_url}", "GATEWAY_HEALTH_TTL_MS": "200"}
    group = ProcessGroup(log_dir=tmp_path / "logs", env=env)
    try:
        spare = group.start("spare-engine", [*engine_argv(model_dir, tmp_path / "logs", stack.s3.bucket), "--port",
                                             str(engine_port)],
                            port=engine_port, wait_s=180, extra_env={"KERNELS_BACKEND": ""})
        group.start("gateway", python("-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                                      str(web_port), "--lifespan", "off", "--no-access-log"), port=web_port)
        yield f"http://127.0.0.1:{web_port}", spare, spare_url
    finally:
        group.stop()


def running_on(url: str, api_key: str) -> int:
    response = httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {api_key}"}, timeout=10)
    return response.json()["requests"]["running"]


def finished_on(url: str, api_key: str) -> int:
    response = httpx.get(f"{url}/stats", headers={"Authorization": f"Bearer {api_key}"}, timeout=10)
    return response.json()["requests"]["finished"]


def test_killing_a_replica_mid_run(stack, gateway_with_a_spare_engine):
    web_url, spare, spare_url = gateway_with_a_spare_engine
    tenant, key = tenant_with_key()
    client = openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=60)
    streams, iterators, received = [], [], [0] * NUM_STREAMS
    for i in range(NUM_STREAMS):  # one at a time, so the gateway's load estimate spreads them over both
        stream = client.completions.create(model="tiny", prompt=f"story {i}", max_tokens=MAX_TOKENS, stream=True,
                                           stream_options={"include_usage": True, "continuous_usage_stats": True},
                                           extra_body={"ignore_eos": True})
        iterators.append(iter(stream))
        streams.append(stream)
        received[i] = next(iterators[i]).usage.completion_tokens
    assert running_on(spare_url, stack.engine_api_key) >= 1, "no stream went to the spare engine"
    os.killpg(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait(10)

    failed = []
    for i, iterator in enumerate(iterators):
        try:
            for chunk in iterator:
                if chunk.usage is not None:
                    received[i] = chunk.usage.completion_tokens
        except openai.APIError as exc:  # the gateway's error event: the stream ended cleanly, not hung
            assert exc.body["code"] == "engine_failed", exc.body
            failed.append(i)
    assert 1 <= len(failed) < NUM_STREAMS
    assert all(received[i] == MAX_TOKENS for i in range(NUM_STREAMS) if i not in failed)

    survivor_before = finished_on(stack.engine_urls[0], stack.engine_api_key)
    answers = [client.completions.create(model="tiny", prompt="after", max_tokens=2) for _ in range(4)]
    assert all(a.usage.completion_tokens == 2 for a in answers)
    assert finished_on(stack.engine_urls[0], stack.engine_api_key) >= survivor_before + 4

    rows = {row.request_id: row for row in usage_rows(tenant, NUM_STREAMS + 4)}
    stream_rows = [rows[s.response.headers["x-request-id"]] for s in streams]
    for i, row in enumerate(stream_rows):
        if i in failed:  # metered exactly for the tokens the client got before the error
            assert (row.status, row.completion_tokens) == ("error", received[i])
            assert 1 <= row.completion_tokens < MAX_TOKENS
        else:
            assert (row.status, row.completion_tokens) == ("ok", MAX_TOKENS)
