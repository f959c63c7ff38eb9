"""Reaching engines: a replica that refuses the connection or is overloaded (503) is passed over for the next one;
every other engine refusal is the client's clean OpenAI error; nothing is sent twice."""

import asyncio
import json

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.replicas import ReplicaPool
from gateway.upstream import Upstream, open_stream, tokenize_prompts

URLS = ["http://a:1", "http://b:1"]


class Engines:
    """Two fake engines: ``behaviour[url]`` is "ok", "refuse" (no connection), or an HTTP status to answer with."""

    def __init__(self, **behaviour):
        self.behaviour = {url: behaviour.get(url.split("//")[1][0], "ok") for url in URLS}
        self.generations: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        base = f"http://{request.url.host}:{request.url.port}"
        what = self.behaviour[base]
        if request.url.path in ("/health", "/stats"):
            return httpx.Response(200, json={"status": "ok", "requests": {"running": 0, "waiting": 0}})
        if what == "refuse":
            raise httpx.ConnectError("refused", request=request)
        if what != "ok":
            return httpx.Response(what, headers={"retry-after": "3"},
                                  json={"error": {"message": "no", "type": "x", "code": f"c{what}", "param": "p"}})
        if request.url.path == "/tokenize":
            body = json.loads(request.content)
            return httpx.Response(200, json={"count": len(body["prompt"]), "max_model_len": 512,
                                             "tokens": body["prompt"]})
        self.generations.append(base)
        return httpx.Response(200, content=b"data: [DONE]\n\n")


def run(engines: Engines, scenario):
    async def main():
        transport = httpx.MockTransport(engines)
        async with httpx.AsyncClient(transport=transport) as http:
            upstream = Upstream(http, transport, ReplicaPool(URLS, http, "key", ttl_s=60))
            candidates = await upstream.pool.candidates(None)
            candidates.sort(key=lambda r: r.url)  # a first, then b
            return await scenario(upstream, candidates)

    return asyncio.run(main())


def generate(upstream, candidates):
    return open_stream(upstream, candidates, "/v1/completions", {"model": "tiny", "prompt": "x"}, "my-model", "req-1")


def test_a_refused_connection_or_a_503_moves_on_to_the_next_replica():
    for behaviour in ({"a": "refuse"}, {"a": 503}):
        engines = Engines(**behaviour)

        async def scenario(upstream, candidates):
            replica, response = await generate(upstream, candidates)
            await response.aclose()
            return replica.url, [r.healthy for r in upstream.pool.replicas]

        chosen, healthy = run(engines, scenario)
        assert chosen == "http://b:1" and engines.generations == ["http://b:1"]
        assert healthy == ([False, True] if behaviour["a"] == "refuse" else [True, True])  # busy is not down


def test_when_no_replica_can_take_it_the_client_gets_a_503_with_retry_after():
    engines = Engines(a=503, b="refuse")

    async def scenario(upstream, candidates):
        return await generate(upstream, candidates)

    with pytest.raises(GatewayError) as caught:
        run(engines, scenario)
    assert caught.value.status == 503 and caught.value.code == "engine_unavailable"
    assert caught.value.headers == {"Retry-After": "3"}


@pytest.mark.parametrize("status, expected", [(400, (400, "c400")), (404, (404, "model_not_found")),
                                              (413, (400, "context_length_exceeded")),
                                              (422, (502, "model_unavailable")), (401, (502, "engine_error"))])
def test_other_engine_refusals_are_final_and_become_clean_client_errors(status, expected):
    engines = Engines(a=status)

    async def scenario(upstream, candidates):
        return await generate(upstream, candidates)

    with pytest.raises(GatewayError) as caught:
        run(engines, scenario)
    assert (caught.value.status, caught.value.code) == expected
    assert engines.generations == []  # never retried elsewhere
    if status == 404:
        assert "my-model" in caught.value.message  # the client's name, never the engine's id


def test_prompts_are_tokenized_on_one_replica_and_the_next_one_answers_if_it_is_down():
    engines = Engines(a="refuse")

    async def scenario(upstream, candidates):
        return await tokenize_prompts(upstream, candidates, [{"prompt": [1, 2, 3]}, {"prompt": [4]}], "m", "req-2")

    assert run(engines, scenario) == ([[1, 2, 3], [4]], 512)
