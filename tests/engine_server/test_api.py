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
    assert len(count["tokens"]) == count["count"] and len(chat_count["tokens"]) == chat_count["count"]


def test_a_chat_sent_as_the_ids_tokenize_gave_answers_as_the_messages_do(engine_server):
    messages = [{"role": "user", "content": "the lazy dog"}]
    with engine_server.client() as http:
        ids = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
        by_messages = http.post("/v1/chat/completions", json={"model": "tiny", "messages": messages,
                                                              "max_tokens": 6, "temperature": 0}).json()
        by_ids = http.post("/v1/chat/completions", json={"model": "tiny", "prompt_token_ids": ids, "max_tokens": 6,
                                                         "temperature": 0}).json()
        both = http.post("/v1/chat/completions", json={"model": "tiny", "prompt_token_ids": ids, "messages": messages})
        past_vocab = http.post("/v1/chat/completions", json={"model": "tiny", "prompt_token_ids": [10**6]})
    assert by_ids["object"] == "chat.completion" and by_ids["choices"][0]["message"]["role"] == "assistant"
    assert by_ids["choices"][0]["message"]["content"] == by_messages["choices"][0]["message"]["content"]
    assert by_ids["usage"] == by_messages["usage"]
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt_token_ids"
    assert past_vocab.status_code == 400 and past_vocab.json()["error"]["param"] == "prompt_token_ids"


@pytest.mark.parametrize("field,value", [("functions", [{"name": "f"}]), ("logit_bias", {"1": 5}),
                                         ("response_format", {"type": "json_schema"}), ("echo", True),
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


def _error(response: httpx.Response) -> tuple[int, str | None, str | None]:
    error = response.json()["error"]
    return response.status_code, error["param"], error["code"]


def test_text_that_cannot_be_tokenized_and_pathological_json_are_400s(engine_server):
    surrogate = b'"\\ud800 abc"'  # valid JSON, decodes to a lone surrogate no tokenizer takes
    chat = b'{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":%s}]}' % surrogate
    with engine_server.client() as http:
        post = lambda path, raw: http.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert _error(post("/v1/completions", b'{"model":"tiny","max_tokens":2,"prompt":%s}' % surrogate)) == (
            400, "prompt", "invalid_request")
        assert _error(post("/v1/completions", b'{"model":"tiny","max_tokens":2,"prompt":["ok",%s]}' % surrogate))[1] \
            == "prompt"
        assert _error(post("/v1/chat/completions", chat))[:2] == (400, "messages[0].content")
        assert _error(post("/v1/completions", b'{"model":"tiny","prompt":"a","stop":%s}' % surrogate))[:2] == (
            400, "stop")
        assert _error(post("/tokenize", b'{"prompt":%s}' % surrogate))[:2] == (400, "prompt")
        deep = b'{"model":"tiny","prompt":"a","metadata":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}"
        huge = b'{"model":"tiny","prompt":"a","seed":1' + b"0" * 5000 + b"}"
        for raw in (deep, huge):
            assert _error(post("/v1/completions", raw)) == (400, None, "invalid_json")
        assert http.post("/v1/completions", json={"model": "tiny", "prompt": "still fine", "max_tokens": 1}
                         ).status_code == 200


@pytest.mark.parametrize("endpoint,fields,param", [
    ("completions", {"temperature": -0.1}, "temperature"), ("completions", {"top_p": 0}, "top_p"),
    ("completions", {"n": 0}, "n"), ("completions", {"max_tokens": 0}, "max_tokens"),
    ("completions", {"presence_penalty": 3}, "presence_penalty"),
    ("completions", {"min_tokens": 9, "max_tokens": 2}, "min_tokens"),
    ("completions", {"stop_token_ids": [-1]}, "stop_token_ids"), ("completions", {"prompt": [10**6]}, "prompt"),
    ("completions", {"stop_token_ids": [10**6], "min_tokens": 1}, "stop_token_ids"),  # killed the engine loop
    ("completions", {"best_of": 1, "n": 3}, "best_of"),
    ("completions", {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens"),
    ("chat", {"frequency_penalty": -2.5}, "frequency_penalty"),
])
def test_out_of_range_values_are_400s_naming_their_field(engine_server, endpoint, fields, param):
    body = {"model": "tiny", "max_tokens": 2, **({"prompt": "a cat"} if endpoint == "completions" else
                                                 {"messages": [{"role": "user", "content": "a cat"}]})}
    body.update(fields)
    with engine_server.client() as http:
        response = http.post(f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}", json=body)
    assert _error(response)[:2] == (400, param), response.json()


def test_max_completion_tokens_null_leaves_max_tokens_in_force(client):
    result = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            extra_body={"ignore_eos": True, "max_completion_tokens": None})
    assert result.usage.completion_tokens == 3


def test_top_logprobs_are_the_k_most_likely_tokens_the_chosen_one_included(engine_server, client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=3,
                                          extra_body={"ignore_eos": True})
    for entry in chat.choices[0].logprobs.content:
        top = entry.top_logprobs
        assert len(top) == 3 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert (top[0].token, top[0].logprob) == (entry.token, entry.logprob)  # greedy: the most likely one
        assert entry.bytes == list(entry.token.encode()) and top[0].bytes == entry.bytes
    assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                          logprobs=True).choices[0].logprobs.content[0].top_logprobs == []
    body = {"model": "tiny", "prompt": "a red bird", "max_tokens": 6, "temperature": 0, "logprobs": 2,
            "ignore_eos": True}
    whole = client.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"},
                                      extra_body={"ignore_eos": True}).choices[0]
    lp = whole.logprobs
    assert "".join(lp.tokens) == whole.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob and max(top.values()) == logprob and len(top) == 2  # chosen among the top 2
    with engine_server.client() as http:
        streamed = [e for e in sse_events(http.post("/v1/completions", json={**body, "stream": True}))
                    if e != "[DONE]" and e["choices"]]
    merged = {key: [v for e in streamed if e["choices"][0]["logprobs"] for v in e["choices"][0]["logprobs"][key]]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert merged == {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs, "top_logprobs": lp.top_logprobs,
                      "text_offset": lp.text_offset}


def test_response_ids_follow_openai_and_method_errors_are_typed(engine_server):
    with engine_server.client() as http:
        completion = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1}).json()
        chat = http.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "x"}]}).json()
        wrong_method = http.get("/v1/completions")
    assert completion["id"].startswith("cmpl-") and chat["id"].startswith("chatcmpl-")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"


def test_a_client_request_id_never_collides_with_another_requests_prompts(engine_server):
    async def run():
        headers = {"Authorization": f"Bearer {engine_server.api_key}"}
        async with httpx.AsyncClient(base_url=engine_server.url, headers=headers, timeout=60) as http:
            two_prompts = http.post("/v1/completions", headers={"X-Request-Id": "x"}, json={
                "model": "tiny", "prompt": ["one", "two"], "max_tokens": 40, "ignore_eos": True})
            named_like_its_second = http.post("/v1/completions", headers={"X-Request-Id": "x-1"}, json={
                "model": "tiny", "prompt": "three", "max_tokens": 40, "ignore_eos": True})
            return await asyncio.gather(two_prompts, named_like_its_second)

    first, second = asyncio.run(run())
    assert (first.status_code, second.status_code) == (200, 200), (first.text, second.text)
    assert len(first.json()["choices"]) == 2 and second.json()["id"] == "x-1"


def test_cache_salt_scopes_prefix_cache_hits(engine_server):
    prompt = [(11 * i) % 200 + 5 for i in range(100)]  # token ids: the same prompt for every request

    def hit_tokens_of(http, **salt) -> int:
        before = http.get("/stats").json()["prefix_cache"]["hit_tokens"]
        response = http.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1, **salt})
        assert response.status_code == 200, response.text
        return http.get("/stats").json()["prefix_cache"]["hit_tokens"] - before

    with engine_server.client() as http:
        assert hit_tokens_of(http, cache_salt="salt-a") == 0
        assert hit_tokens_of(http, cache_salt="salt-b") == 0
        assert hit_tokens_of(http, cache_salt="salt-a") == 96  # 6 full blocks of 16; one token is left to compute
        refused = [http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "cache_salt": salt})
                   for salt in ["", "s" * 257, 5]]
    assert [r.status_code for r in refused] == [400, 400, 400]
    assert {r.json()["error"]["param"] for r in refused} == {"cache_salt"}


def test_errors_quote_at_most_an_excerpt_of_the_client_input(engine_server):
    long_name = "f" * 100_000
    with engine_server.client() as http:
        unknown = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", long_name: 1})
        stops = http.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                                  "stop_token_ids": list(range(10**6, 10**6 + 100_000))})
        past_vocab = http.post("/v1/completions", json={"model": "tiny", "prompt": "x",
                                                       "stop_token_ids": list(range(10**6, 10**6 + 200))})
    for response in (unknown, stops, past_vocab):
        assert response.status_code == 400 and len(response.content) < 1000, response.content[:300]
    assert stops.json()["error"]["param"] == "stop_token_ids" and "up to 256" in stops.json()["error"]["message"]
    assert past_vocab.json()["error"]["param"] == "stop_token_ids"
