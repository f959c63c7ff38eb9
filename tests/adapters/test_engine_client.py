"""The engine client against a scripted engine (httpx.MockTransport): the requests it sends (paths, bearer key,
bodies), how it reads the engine's OpenAI-shaped errors, and its choice of engines. The real engine is met in
test_e2e_engine.py."""

import json

import httpx
import pytest

from adapters.engine_client import (
    EngineClient,
    EngineError,
    adapter_source,
    engine_headers,
    unload_everywhere,
    warm_load,
)

SOURCE = adapter_source(engine_id="adp_abc_v1", uri="s3://lora-adapters/tenants/1/adapters/u/v1/", sha256="f" * 64)
OK_COMPLETION = {"choices": [{"text": "hi", "index": 0}], "usage": {"completion_tokens": 2, "prompt_tokens": 1}}


class ScriptedEngines:
    """Engines by host: each answers from a dict path -> (status, body) or raises ConnectError when down."""

    def __init__(self, answers: dict[str, dict | None]):
        self.answers = answers
        self.calls: list[tuple[str, str, dict, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = json.loads(request.content or b"{}")
        self.calls.append((host, request.url.path, body, request.headers.get("authorization", "")))
        engine = self.answers[host]
        if engine is None:
            raise httpx.ConnectError("connection refused", request=request)
        status, payload = engine.get(request.url.path, (404, {"error": {"message": "no route", "code": "not_found"}}))
        return httpx.Response(status, json=payload)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def healthy() -> dict:
    return {"/v1/load_lora_adapter": (200, {"status": "loaded", "id": SOURCE["id"]}),
            "/v1/completions": (200, OK_COMPLETION),
            "/v1/unload_lora_adapter": (200, {"status": "unloaded", "id": SOURCE["id"]})}


def test_warm_load_loads_then_generates_through_the_adapter_with_the_bearer_key():
    engines = ScriptedEngines({"e1": healthy()})
    assert warm_load(["http://e1:8100"], "secret", SOURCE, timeout=5, transport=engines.transport()) == "http://e1:8100"
    (_, load_path, load_body, auth), (_, gen_path, gen_body, _) = engines.calls
    assert (load_path, load_body, auth) == ("/v1/load_lora_adapter", {"adapter": SOURCE}, "Bearer secret")
    assert gen_path == "/v1/completions"
    assert gen_body["model"] == SOURCE["id"] and gen_body["adapter"] == SOURCE
    assert gen_body["max_tokens"] >= 1 and gen_body["temperature"] == 0


def test_a_refusal_by_the_engine_fails_at_once_with_its_code_and_unloads():
    refusing = {**healthy(), "/v1/completions": (422, {"error": {
        "message": "tensor 'x' holds NaN or infinite values", "type": "invalid_request_error",
        "code": "non_finite_weights", "param": None}})}
    engines = ScriptedEngines({"e1": refusing, "e2": healthy()})
    with pytest.raises(EngineError) as caught:
        warm_load(["http://e1:8100"], "k", SOURCE, timeout=5, transport=engines.transport())
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (422, "non_finite_weights", False)
    assert "holds NaN" in caught.value.message
    assert engines.calls[-1][1:3] == ("/v1/unload_lora_adapter", {"id": SOURCE["id"]})


def test_an_engine_that_is_down_or_busy_is_skipped_for_the_next(monkeypatch):
    busy = {"/v1/load_lora_adapter": (503, {"error": {"message": "overloaded", "code": "overloaded"}})}
    engines = ScriptedEngines({"down": None, "busy": busy, "up": healthy()})
    monkeypatch.setattr("random.sample", lambda seq, k: list(seq))  # try them in the order given
    url = warm_load(["http://down", "http://busy", "http://up"], "k", SOURCE, timeout=5,
                    transport=engines.transport())
    assert url == "http://up"
    assert [host for host, *_ in engines.calls][:2] == ["down", "busy"]


def test_when_no_engine_can_be_used_the_error_is_retryable():
    engines = ScriptedEngines({"down": None})
    with pytest.raises(EngineError) as caught:
        warm_load(["http://down"], "k", SOURCE, timeout=5, transport=engines.transport())
    assert caught.value.status is None and caught.value.retryable and caught.value.code == "engine_unreachable"


def test_an_empty_generation_is_a_refusal():
    empty = {**healthy(), "/v1/completions": (200, {"choices": [], "usage": {"completion_tokens": 0}})}
    engines = ScriptedEngines({"e1": empty})
    with pytest.raises(EngineError) as caught:
        warm_load(["http://e1"], "k", SOURCE, timeout=5, transport=engines.transport())
    assert caught.value.code == "smoke_generation_empty" and not caught.value.retryable


def test_non_json_errors_still_carry_status_and_text():
    def answer(request):
        return httpx.Response(401, text="nope")

    with EngineClient("http://e1", "bad", timeout=5, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(EngineError) as caught:
            client.load_adapter(SOURCE)
    assert (caught.value.status, caught.value.code) == (401, "engine_http_401")
    assert "nope" in caught.value.message and not caught.value.retryable


def test_unload_everywhere_asks_every_engine_and_reports_who_failed():
    unknown = {"/v1/unload_lora_adapter": (404, {"error": {"message": "unknown adapter", "code": "not_found"}})}
    engines = ScriptedEngines({"a": healthy(), "b": unknown, "c": None})
    failures = unload_everywhere(["http://a", "http://b", "http://c"], "k", "adp_abc_v1", timeout=5,
                                 transport=engines.transport())
    assert [(host, path, body) for host, path, body, _ in engines.calls] == [
        (host, "/v1/unload_lora_adapter", {"id": "adp_abc_v1"}) for host in "abc"]
    assert list(failures) == ["http://c"] and failures["http://c"].retryable  # unknown id (404) is unloaded


def test_headers_carry_the_request_id_when_given():
    assert engine_headers("k") == {"Authorization": "Bearer k"}
    assert engine_headers("k", "req-1") == {"Authorization": "Bearer k", "X-Request-Id": "req-1"}
