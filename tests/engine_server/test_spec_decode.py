"""Speculative decoding through the engine server: --speculative-config, the same greedy answers, and the
counters in /stats and /metrics."""

import pytest

from tests.engine_server.conftest import start_engine

PROMPT = [40, 41, 42, 43, 40, 41, 42, 43, 40, 41, 42]


@pytest.fixture(scope="module")
def spec_server(tiny_model_dir, tmp_path_factory):
    server = start_engine(tiny_model_dir, tmp_path_factory.mktemp("spec-logs"), "--no-enable-lora",
                          "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')
    try:
        yield server
    finally:
        server.group.stop()


def complete(server, **extra):
    with server.client() as http:
        response = http.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 24,
                                                      "temperature": 0, "ignore_eos": True, **extra})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_greedy_answers_match_the_server_without_speculation(spec_server, engine_server):
    assert complete(spec_server) == complete(engine_server)
    with spec_server.client() as http:
        spec = http.get("/stats").json()["speculative"]
        metrics = http.get("/metrics").text
    assert spec["method"] == "ngram" and spec["drafted_tokens"] > 0
    assert f'engine_spec_decode_drafted_tokens{{method="ngram"}} {float(spec["drafted_tokens"])}' in metrics
    with engine_server.client() as http:
        assert http.get("/stats").json()["speculative"] is None


def test_a_bad_speculative_config_stops_the_server_with_its_reason(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "engine", "serve", str(tiny_model_dir), "--speculative-config",
                             '{"method": "medusa"}'], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "speculative_config.method" in result.stderr
