"""The OpenAI-compatible API through the whole stack with the ``openai`` client: generation streamed and not,
models, authentication, refusals before the engine, max_tokens from the tenant's quota, metrics."""

import datetime
import time

import openai
import pytest
from django.utils import timezone

from tenants import services
from tenants.models import Scope, TenantAPIKey
from tests.gateway.helpers import (
    GENEROUS,
    gateway_http,
    openai_client,
    prompt_tokens,
    ready_adapter,
    tenant_with_key,
    usage_rows,
)

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
MESSAGES = [{"role": "user", "content": "the quick cat"}]


def test_chat_and_completions_streamed_and_not_are_metered_exactly(stack):
    tenant, key = tenant_with_key()
    client = openai_client(stack, key)
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                                            extra_body={"ignore_eos": True})
    chat = raw.parse()
    assert raw.headers["x-ratelimit-limit-requests"] == str(GENEROUS["requests_per_minute"])
    assert raw.headers["x-ratelimit-remaining-requests"] == str(GENEROUS["requests_per_minute"] - 1)
    assert raw.headers["x-request-id"] == chat.id and chat.id.startswith("chatcmpl-")
    assert (chat.model, chat.object, chat.choices[0].finish_reason) == ("tiny", "chat.completion", "length")
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    chat_prompt = prompt_tokens(stack, {"messages": MESSAGES})
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (chat_prompt, 6)

    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (chat_prompt, 5)
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"

    plain = list(client.completions.create(model="tiny", prompt="a dog", max_tokens=4, stream=True,
                                           extra_body={"ignore_eos": True}))
    assert all(c.usage is None and c.model == "tiny" for c in plain)
    text = client.completions.create(model="tiny", prompt=["a dog", "two cats"], n=2, max_tokens=3,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in text.choices) == [0, 1, 2, 3] and text.usage.completion_tokens == 12

    rows = usage_rows(tenant, 4)
    completion_prompt = prompt_tokens(stack, {"prompt": "a dog"})
    two_prompts = completion_prompt + prompt_tokens(stack, {"prompt": "two cats"})
    assert [(r.prompt_tokens, r.completion_tokens, r.status) for r in rows] == [
        (chat_prompt, 6, "ok"), (chat_prompt, 5, "ok"), (completion_prompt, 4, "ok"), (two_prompts, 12, "ok")]
    assert {r.api_key_id for r in rows} == {key.partition(".")[0]} and {r.adapter for r in rows} == {""}
    assert rows[0].request_id == chat.id and not any(r.playground for r in rows)


def test_without_max_tokens_the_tenant_default_applies_and_shrinks_to_fit_the_context(stack):
    tenant, key = tenant_with_key(quota={**GENEROUS, "default_max_tokens": 7, "max_tokens_limit": 50})
    client = openai_client(stack, key)
    small = client.completions.create(model="tiny", prompt="a cat", extra_body={"ignore_eos": True})
    assert small.usage.completion_tokens == 7
    long_prompt = [65] * 508  # token ids: 508 of the context's 512
    near_full = client.completions.create(model="tiny", prompt=long_prompt, extra_body={"ignore_eos": True})
    assert (near_full.usage.prompt_tokens, near_full.usage.completion_tokens) == (508, 4)
    with pytest.raises(openai.BadRequestError) as over_context:
        client.completions.create(model="tiny", prompt=long_prompt, max_tokens=5)
    assert over_context.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as over_limit:
        client.completions.create(model="tiny", prompt="a", max_tokens=51)
    assert over_limit.value.body["param"] == "max_tokens" and "50" in over_limit.value.message
    assert len(usage_rows(tenant, 2)) == 2  # the refused ones reserved nothing and left no row


def test_unsupported_fields_are_refused_by_name_before_anything_is_reserved(stack):
    tenant, key = tenant_with_key()
    client = openai_client(stack, key)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, logit_bias={"1": 5})
    assert caught.value.body["param"] == "logit_bias" and caught.value.code == "unsupported_parameter"
    with gateway_http(stack, key) as http:
        response = http.post("/chat/completions", json={"model": "tiny", "messages": MESSAGES, "adapter": {}})
        assert response.status_code == 400 and response.json()["error"]["param"] == "adapter"
        assert response.headers["x-ratelimit-remaining-requests"] == str(GENEROUS["requests_per_minute"])
        assert http.get("/chat/completions").status_code == 405
        assert http.post("/nothing/here", json={}).json()["error"]["code"] == "unknown_url"
    assert usage_rows(tenant, 0, timeout=0) == []


def test_bad_values_are_400s_naming_the_field_whichever_side_finds_them(stack):
    """The gateway's own checks and the engine's (passed through with their ``param``) answer alike."""
    tenant, key = tenant_with_key(quota={**GENEROUS, "max_tokens_limit": 100, "default_max_tokens": 50})
    surrogate = b'"\\ud800 abc"'
    with gateway_http(stack, key) as http:
        def error(path, body=None, raw=None):
            response = http.post(path, json=body) if raw is None else http.post(
                path, content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code == 400, response.text
            return response.json()["error"]["param"], response.json()["error"]["code"]

        assert error("/completions", {"model": "tiny", "prompt": "a", "temperature": -1})[0] == "temperature"
        assert error("/completions", {"model": "tiny", "prompt": "a", "stop_token_ids": [-1]})[0] == "stop_token_ids"
        assert error("/completions", raw=b'{"model":"tiny","prompt":%s}' % surrogate)[0] == "prompt"
        assert error("/chat/completions", raw=b'{"model":"tiny","messages":[{"role":"user","content":%s}]}'
                     % surrogate)[0] == "messages[0].content"
        assert error("/completions", raw=b'{"model":"tiny","prompt":"a","metadata":' + b"[" * 5000 + b"]" * 5000
                     + b"}") == (None, "invalid_json")
        assert error("/completions", raw=b'{"model":"tiny","prompt":"a","seed":1' + b"0" * 5000 + b"}") == (
            None, "invalid_json")
        assert error("/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_completion_tokens": 0})[0] \
            == "max_completion_tokens"
        assert error("/chat/completions", {"model": "tiny", "messages": MESSAGES,
                                           "max_completion_tokens": 101}) == ("max_completion_tokens",
                                                                             "max_tokens_over_limit")
        assert error("/completions", {"model": "tiny", "prompt": [65] * 600, "max_tokens": 5}) == (
            "prompt", "context_length_exceeded")
    chat = openai_client(stack, key).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, extra_body={"ignore_eos": True, "max_completion_tokens": None})
    assert chat.usage.completion_tokens == 3
    # The gateway's own refusals (negative stop_token_ids among them) reserve nothing; the engine's one (after the
    # reservation: a temperature out of range) is an error row with no completion tokens, as any failed request.
    rows = usage_rows(tenant, 2)
    assert sorted((r.status, r.completion_tokens) for r in rows) == [("error", 0), ("ok", 3)]


def test_models_lists_the_base_model_and_only_the_callers_ready_adapters(stack):
    tenant, key = tenant_with_key()
    other, _ = tenant_with_key()
    ready_adapter(tenant, "support-bot", 1)
    ready_adapter(tenant, "support-bot", 2)
    ready_adapter(tenant, "sql")
    ready_adapter(other, "secret")
    _, restricted = services.api_key_create(tenant=tenant, name="r", scopes=[Scope.INFERENCE], adapter_names=["sql"])
    listed = openai_client(stack, key).models.list()
    assert [m.id for m in listed.data] == ["tiny", "sql", "support-bot"]
    assert {m.owned_by for m in listed.data[1:]} == {tenant.slug}
    assert [m.id for m in openai_client(stack, restricted).models.list().data] == ["tiny", "sql"]
    client = openai_client(stack, key)
    assert client.models.retrieve("support-bot:1").id == "support-bot:1"
    assert client.models.retrieve("tiny").owned_by == "system"
    for hidden in ("secret", "support-bot:3", "nope"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(hidden)


def test_another_tenants_adapter_is_exactly_a_model_that_does_not_exist(stack):
    tenant, key = tenant_with_key()
    other, _ = tenant_with_key()
    theirs = ready_adapter(other, "their-bot", 1)
    ready_adapter(tenant, "mine")
    _, restricted = services.api_key_create(tenant=tenant, name="r", scopes=[Scope.INFERENCE], adapter_names=["x"])
    with gateway_http(stack, key) as http, gateway_http(stack, restricted) as narrow:
        def refusal(client, model):
            response = client.post("/chat/completions", json={"model": model, "messages": MESSAGES})
            assert response.status_code == 404
            return response.json()["error"]["message"].replace(model, "<model>"), response.json()["error"]["code"]

        expected = refusal(http, "never-existed")
        for model in ("their-bot", "their-bot:1", theirs.engine_id, "mine:2", "../x", "tiny:1"):
            assert refusal(http, model) == expected
        assert refusal(narrow, "mine") == expected  # outside the key's adapters
    assert usage_rows(tenant, 0, timeout=0) == []


def test_bad_keys_are_refused_in_openai_shape(stack):
    tenant, key = tenant_with_key()
    _, manage = services.api_key_create(tenant=tenant, name="m", scopes=[Scope.MANAGE])
    for bad, error in ((None, openai.AuthenticationError), ("nope", openai.AuthenticationError),
                       ("abc.def", openai.AuthenticationError), (manage, openai.PermissionDeniedError)):
        with gateway_http(stack, bad) as http:
            response = http.post("/chat/completions", json={"model": "tiny", "messages": MESSAGES})
        assert response.status_code == (403 if error is openai.PermissionDeniedError else 401)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.PermissionDeniedError):
        openai_client(stack, manage).models.list()
    client = openai_client(stack, key)
    assert client.models.list().data
    services.tenant_set_status(tenant=tenant, status="suspended")
    with pytest.raises(openai.PermissionDeniedError):
        client.models.list()
    services.tenant_set_status(tenant=tenant, status="active")
    assert client.models.list().data
    services.api_key_revoke(tenant=tenant, key=TenantAPIKey.objects.get(prefix=key.partition(".")[0]))
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    _, expiring = services.api_key_create(tenant=tenant, name="e", scopes=[Scope.INFERENCE],
                                          expires_at=timezone.now() + datetime.timedelta(seconds=1))
    openai_client(stack, expiring).models.list()  # now cached by the gateway, with its expiry
    time.sleep(1.1)
    with pytest.raises(openai.AuthenticationError):
        openai_client(stack, expiring).models.list()


def test_a_key_the_gateway_has_cached_is_confirmed_before_any_answer(stack):
    """The gateway counts a cached key's prompt while Redis confirms the key: a quota changed meanwhile applies at
    once, and a tenant suspended or a key revoked meanwhile gets its 403/401 whatever else the request got wrong."""
    tenant, key = tenant_with_key()
    client = openai_client(stack, key)
    client.completions.create(model="tiny", prompt="a cat", max_tokens=2)  # now cached by the gateway
    services.quota_set(tenant=tenant, changes={**GENEROUS, "max_tokens_limit": 3, "default_max_tokens": 3})
    with pytest.raises(openai.BadRequestError) as over_limit:
        client.completions.create(model="tiny", prompt="a cat", max_tokens=4)
    assert over_limit.value.body["param"] == "max_tokens" and "3" in over_limit.value.message
    requests = [dict(model="tiny", prompt="a cat", max_tokens=2), dict(model="no-such-model", prompt="a cat"),
                dict(model="tiny", prompt="a cat", max_tokens=2, extra_body={"tools": []}),
                dict(model="tiny", prompt="a cat", max_tokens=2, stream=True)]
    services.tenant_set_status(tenant=tenant, status="suspended")
    for request in requests:
        with pytest.raises(openai.PermissionDeniedError):
            client.completions.create(**request)
    services.tenant_set_status(tenant=tenant, status="active")
    client.completions.create(model="tiny", prompt="a cat", max_tokens=2)
    services.api_key_revoke(tenant=tenant, key=TenantAPIKey.objects.get(prefix=key.partition(".")[0]))
    for request in requests:
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(**request)
    assert len(usage_rows(tenant, 2)) == 2  # the two that were answered; the refused ones reserved nothing


def test_metrics_have_no_tenant_key_or_adapter_labels(stack):
    tenant, key = tenant_with_key()
    ready_adapter(tenant, "labelled-bot")
    openai_client(stack, key).completions.create(model="tiny", prompt="a", max_tokens=2)
    with gateway_http(stack, key) as http:
        http.post("/completions", json={"model": "labelled-bot", "prompt": "a"})
    with gateway_http(stack, None) as http:
        text = http.get(f"{stack.web_url}/metrics").text
    assert 'gateway_requests_total{endpoint="completions",status="200"}' in text
    assert "gateway_time_to_first_token_seconds_bucket" in text
    for secret in (tenant.slug, key.partition(".")[0], "labelled-bot", f'"{tenant.pk}"'):
        assert secret not in text
