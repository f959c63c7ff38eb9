"""Registered schemas through the whole stack with its real engines: a schema registered by the management API is
compiled on every engine replica under the tenant's cache salt, a chat completion naming it is constrained by it and
hits the warm grammar on whichever replica serves it; what the engines refuse fails with their reason and the
gateway refuses it by name; another tenant's name is unknown."""

import json
import time

import httpx
import jsonschema
import openai
import pytest

from tenants.models import Scope
from tests.gateway.helpers import engine_http, openai_client, tenant_with_key

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
MESSAGES = [{"role": "user", "content": "Open a ticket for the billing team."}]
TICKET = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^T-[0-9]{4}$"},
                                           "priority": {"enum": ["low", "high"]}},
          "required": ["id", "priority"], "additionalProperties": False}


def manage(stack, tenant, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{stack.web_url}/api/tenants/{tenant.slug}/schemas/",
                        headers={"Authorization": f"Bearer {key}"}, timeout=60)


def settled(api: httpx.Client, name: str, number: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = api.get(f"{name}/versions/{number}/").json()
        if body["status"] != "pending" or time.monotonic() > deadline:
            assert body["status"] != "pending", f"version {number} of {name} still pending after {timeout}s"
            return body
        time.sleep(0.2)


def grammar_cache(stack) -> dict[str, int]:
    """The engines' grammar-cache counters (``/stats`` structured_outputs.grammar_cache), summed over replicas."""
    total = {"hits": 0, "misses": 0, "entries": 0}
    for index in range(len(stack.engine_urls)):
        with engine_http(stack, index) as engine:
            counters = engine.get("/stats").json()["structured_outputs"]["grammar_cache"]
        total = {name: total[name] + counters[name] for name in total}
    return total


def test_a_registered_schema_is_warm_on_every_engine_and_constrains_requests_by_name(stack):
    tenant, key = tenant_with_key(scopes=(Scope.INFERENCE, Scope.MANAGE))
    with manage(stack, tenant, key) as api:
        created = api.post("", json={"name": "ticket", "schema": TICKET, "strict": True})
        assert created.status_code == 201, created.text
        version = settled(api, "ticket", 1)
    assert version["status"] == "ready", version
    assert version["warm_replicas"] == len(stack.engine_urls) and version["compile_ms"] >= 0
    before = grammar_cache(stack)
    client = openai_client(stack, key)
    for response_format in ({"type": "json_schema", "json_schema": {"name": "ticket"}},
                            {"type": "json_schema", "json_schema": {"name": "ticket", "version": 1}}):
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=200, temperature=0,
                                               response_format=response_format)
        assert reply.choices[0].finish_reason == "stop", reply
        jsonschema.validate(json.loads(reply.choices[0].message.content), TICKET)
    after = grammar_cache(stack)
    # Both requests found the grammar the warm compile left under the tenant's salt: no compile in a request.
    assert after["misses"] == before["misses"] and after["hits"] >= before["hits"] + 2, (before, after)
    assert after["entries"] == before["entries"]


def test_a_schema_the_engines_refuse_fails_with_their_reason_and_is_refused_by_name(stack):
    tenant, key = tenant_with_key(scopes=(Scope.INFERENCE, Scope.MANAGE))
    outsider, outsider_key = tenant_with_key()
    with manage(stack, tenant, key) as api:
        assert api.post("", json={"name": "tags", "schema": {"type": "array", "uniqueItems": True}}
                        ).status_code == 201
        version = settled(api, "tags", 1)
    assert (version["status"], version["failure_code"]) == ("failed", "invalid_request"), version
    assert "uniqueItems" in version["failure_reason"] and "127.0.0.1" not in version["failure_reason"]
    with pytest.raises(openai.BadRequestError) as failed:
        openai_client(stack, key).chat.completions.create(
            model="tiny", messages=MESSAGES, response_format={"type": "json_schema", "json_schema": {"name": "tags"}})
    assert failed.value.body["code"] == "schema_failed" and "uniqueItems" in failed.value.message
    assert failed.value.body["param"] == "response_format.json_schema.name"
    with pytest.raises(openai.BadRequestError) as unknown:
        openai_client(stack, outsider_key).chat.completions.create(
            model="tiny", messages=MESSAGES, response_format={"type": "json_schema", "json_schema": {"name": "tags"}})
    assert (unknown.value.body["code"], unknown.value.body["param"]) == (
        "schema_not_found", "response_format.json_schema.name")
    assert outsider.pk != tenant.pk
