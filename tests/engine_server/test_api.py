"""The engine server's OpenAI-compatible API against a tiny random Llama, with the official `openai` client."""

import asyncio
import json
import time

import httpx
import openai
import pytest


@pytest.fixture
def client(engine_server):
    return openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key=engine_server.api_key, max_retries=0)


def sse_events(response: httpx.Response) -> list[dict | str]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_completion_with_the_openai_client(client):
    result = client.completions.create(model="tiny", prompt="the quick cat", max_tokens=7, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert result.object == "text_completion" and result.model == "tiny"
    assert result.choices[0].finish_reason == "length" and result.choices[0].text
    assert result.usage.completion_tokens == 7 and result.usage.prompt_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + 7
    again = client.completions.create(model="tiny", prompt="the quick cat", max_tokens=7, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert again.choices[0].text == result.choices[0].text  # greedy is deterministic


def test_chat_with_the_openai_client_and_n(client):
    result = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a dog runs"}], max_tokens=5, n=2, seed=3,
        temperature=1.0, extra_body={"ignore_eos": True})
    assert result.object == "chat.completion"
    assert [c.index for c in result.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.message.content for c in result.choices)
    assert result.usage.completion_tokens == 10


def test_streaming_with_usage_in_the_final_chunk(client):
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the moon"}], max_tokens=9, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    whole = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "the moon"}], max_tokens=9, temperature=0,
        extra_body={"ignore_eos": True})
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_cut_stream_has_exact_cumulative_usage(engine_server):
    body = {"model": "tiny", "prompt": "a red bird sings", "max_tokens": 200, "temperature": 0, "logprobs": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with engine_server.client() as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        delivered = 0
        seen = 0
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: "):])
            for choice in event["choices"]:
                delivered += len((choice.get("logprobs") or {}).get("tokens", []))
            assert event["usage"]["completion_tokens"] == delivered
            seen += 1
            if seen == 12:
                break  # the client goes away mid-stream
    assert 0 < delivered < 200


def test_tokenize_counts_equal_the_engine_prompt_lengths(engine_server, client):
    with engine_server.client() as http:
        count = http.post("/tokenize", json={"prompt": "the lazy dog sleeps under a tree"}).json()
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
        chat_count = http.post("/tokenize", json={"messages": messages}).json()
    completion = client.completions.create(model="tiny", prompt="the lazy dog sleeps under a tree", max_tokens=1)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert count["count"] == completion.usage.prompt_tokens and count["max_model_len"] == 512
    assert chat_count["count"] == chat.usage.prompt_tokens


@pytest.mark.parametrize("field,value", [("tools", [{"type": "function"}]), ("logit_bias", {"1": 5}),
                                         ("response_format", {"type": "json_object"}), ("echo", True),
                                         ("frobnicate", 1)])
def test_unsupported_fields_are_refused_by_name(engine_server, field, value):
    endpoint = "/v1/completions" if field == "echo" else "/v1/chat/completions"
    body = {"model": "tiny", "max_tokens": 2, field: value}
    body.update({"prompt": "x"} if field == "echo" else {"messages": [{"role": "user", "content": "x"}]})
    with engine_server.client() as http:
        response = http.post(endpoint, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]


def test_documented_errors(engine_server):
    with engine_server.client() as http:
        bad_json = http.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        unknown = http.post("/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 1})
        oversize = http.post("/v1/completions", json={"model": "tiny", "prompt": "cat " * 600, "max_tokens": 1})
        too_long = http.post("/v1/completions", json={"model": "tiny", "prompt": "cat", "max_tokens": 600})
        bad_value = http.post("/v1/completions", json={"model": "tiny", "prompt": "cat", "top_p": 7})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert oversize.status_code == 413 and "context" in oversize.json()["error"]["message"]
    assert too_long.status_code == 413 and too_long.json()["error"]["param"] == "max_tokens"
    assert bad_value.status_code == 400 and "top_p" in bad_value.json()["error"]["message"]


def test_bearer_key_and_request_ids(engine_server):
    with httpx.Client(base_url=engine_server.url) as anonymous:
        assert anonymous.get("/health").status_code == 200
        refused = anonymous.post("/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert anonymous.get("/stats", headers={"Authorization": "Bearer wrong"}).status_code == 401
    with engine_server.client() as http:
        response = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1},
                             headers={"X-Request-Id": "gw-123"})
    assert response.headers["x-request-id"] == "gw-123" and response.json()["id"] == "gw-123"


def test_models_and_stats_shape(engine_server):
    with engine_server.client() as http:
        models = http.get("/v1/models").json()
        stats = http.get("/stats").json()
        metrics = http.get("/metrics").text
    assert models["data"][0]["id"] == "tiny"
    assert set(stats) >= {"model", "uptime_s", "requests", "kv_blocks", "prefix_cache_hit_rate", "adapters",
                          "tokens", "saturated"}
    assert stats["kv_blocks"]["total"] > 0 and stats["model"] == "tiny"
    assert "engine_time_to_first_token_seconds_bucket" in metrics and "engine_kv_blocks_total" in metrics


def test_disconnect_mid_stream_frees_kv_blocks(engine_server):
    body = {"model": "tiny", "prompt": "stone river " * 20, "max_tokens": 400, "ignore_eos": True,
            "stream": True, "temperature": 0}
    with engine_server.client() as http, http.stream("POST", "/v1/completions", json=body) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i == 5:
                assert engine_server.stats()["kv_blocks"]["used"] > 0
                break
    deadline = time.monotonic() + 10
    while engine_server.stats()["kv_blocks"]["used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = engine_server.stats()
    assert stats["kv_blocks"]["used"] == 0 and stats["requests"]["running"] == 0
    assert stats["requests"]["aborted"] >= 1


def test_64_concurrent_streams_complete_with_exact_counts(engine_server):
    async def one(http: httpx.AsyncClient, i: int) -> tuple[int, int]:
        body = {"model": "tiny", "prompt": f"request {i} says", "max_tokens": 12 + i % 5, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7, "seed": i}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            usage, done = None, False
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    usage = json.loads(line[6:]).get("usage") or usage
            assert done
            return usage["completion_tokens"], 12 + i % 5

    async def run():
        limits = httpx.Limits(max_connections=64)
        headers = {"Authorization": f"Bearer {engine_server.api_key}"}
        async with httpx.AsyncClient(base_url=engine_server.url, headers=headers, timeout=120, limits=limits) as h:
            return await asyncio.gather(*(one(h, i) for i in range(64)))

    results = asyncio.run(run())
    assert all(got == want for got, want in results)
