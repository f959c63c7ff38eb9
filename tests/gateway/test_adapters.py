"""Adapters through the gateway to LoRA engines: served by name and name:version to their tenant only, keys
restricted to adapters, and affinity (one adapter stays on one replica while it is healthy). The refusals that
never reach an engine are tested in test_api.py."""

import httpx
import pytest

from adapters import selectors
from gateway.replicas import rendezvous_score
from tenants import services
from tenants.models import Scope
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.stack_client import Caller
from tests.gateway.helpers import engine_http, gateway_http, tenant_with_key, usage_rows

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
MESSAGES = [{"role": "user", "content": "the quick cat"}]


def uploaded(stack, tenant, name: str, adapter_dir) -> str:
    """Upload ``adapter_dir`` as ``name`` for ``tenant`` through the registry's API; its engine id once ready."""
    caller = Caller(stack, tenant)
    caller.create(name)
    assert caller.upload_streamed(name, [adapter_dir / CONFIG, adapter_dir / WEIGHTS]).status_code == 202
    body = caller.wait(name, [1])[1]
    assert body["status"] == "ready", body
    return selectors.adapter_resolve(tenant_id=tenant.pk, ref=name).engine_id


def ask(http: httpx.Client, model: str) -> httpx.Response:
    return http.post("/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 3,
                                                "ignore_eos": True})


def test_an_adapter_serves_its_tenant_only_by_name_version_or_not_at_all(stack, served_good_adapter):
    owner, owner_key = tenant_with_key()
    outsider, outsider_key = tenant_with_key()
    owner_id = uploaded(stack, owner, "support-bot", served_good_adapter)
    _, narrow_key = services.api_key_create(tenant=owner, name="n", scopes=[Scope.INFERENCE], adapter_names=["x"])
    with gateway_http(stack, owner_key) as http:
        for model in ("support-bot", "support-bot:1"):
            answer = ask(http, model)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model and owner_id not in answer.text
    with gateway_http(stack, outsider_key) as http, gateway_http(stack, narrow_key) as narrow:
        unknown = ask(http, "never-existed").json()["error"]
        for client, model in ((http, "support-bot"), (http, "support-bot:1"), (http, owner_id),
                              (narrow, "support-bot")):
            refused = ask(client, model)
            assert refused.status_code == 404
            assert refused.json()["error"]["message"].replace(model, "M") == unknown["message"].replace(
                "never-existed", "M")
    # The outsider's own adapter of the same name is a different version: theirs, not the owner's.
    outsider_id = uploaded(stack, outsider, "support-bot", served_good_adapter)
    assert outsider_id != owner_id
    with gateway_http(stack, outsider_key) as http:
        assert ask(http, "support-bot").status_code == 200
    assert [r.adapter for r in usage_rows(owner, 2)] == ["support-bot", "support-bot"]
    assert [r.adapter for r in usage_rows(outsider, 1)] == ["support-bot"]


def test_requests_for_one_adapter_stay_on_its_rendezvous_replica(stack, served_good_adapter):
    tenant, key = tenant_with_key()
    engine_id = uploaded(stack, tenant, "sticky", served_good_adapter)
    home = max(range(len(stack.engine_urls)), key=lambda i: rendezvous_score(engine_id, stack.engine_urls[i]))

    def finished() -> list[int]:
        counts = []
        for index in range(len(stack.engine_urls)):
            with engine_http(stack, index) as engine:
                counts.append(engine.get("/stats").json()["requests"]["finished"])
        return counts

    before = finished()
    with gateway_http(stack, key) as http:
        assert all(ask(http, "sticky").status_code == 200 for _ in range(8))
    after = finished()
    assert [b - a for a, b in zip(before, after, strict=True)] == [8 if i == home else 0
                                                                   for i in range(len(stack.engine_urls))]


def test_structured_outputs_through_the_gateway_with_an_adapter(stack, served_good_adapter):
    """The openai client's ``chat.completions.parse`` with a Pydantic model, unchanged, through the gateway and
    a tenant's adapter; a constraint that does not compile is the client's 400."""
    import openai
    import pydantic

    from tests.gateway.helpers import openai_client

    class Ticket(pydantic.BaseModel):
        priority: int = pydantic.Field(ge=1, le=5)
        team: str = pydantic.Field(pattern="^(billing|support)$")

    tenant, key = tenant_with_key()
    uploaded(stack, tenant, "triage", served_good_adapter)
    client = openai_client(stack, key)
    for model in ("triage", "tiny"):
        result = client.chat.completions.parse(model=model, messages=MESSAGES, response_format=Ticket,
                                               max_tokens=200, temperature=0)
        ticket = result.choices[0].message.parsed
        assert isinstance(ticket, Ticket) and result.model == model
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="triage", messages=MESSAGES,
                                       extra_body={"structured_outputs": {"regex": "(open"}})
    assert refused.value.body["param"] == "structured_outputs.regex"
    strict = {**Ticket.model_json_schema(), "additionalProperties": False}  # as OpenAI's strict tools have it
    tool = {"type": "function", "function": {"name": "open_ticket", "parameters": strict, "strict": True}}
    kwargs = dict(model="triage", messages=MESSAGES, tools=[tool], tool_choice="required", max_tokens=200,
                  parallel_tool_calls=False,
                  temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls[0].function.name == "open_ticket"
    Ticket.model_validate_json(whole.message.tool_calls[0].function.arguments)
    streamed = [c.choices[0].delta.tool_calls for c in client.chat.completions.create(stream=True, **kwargs)
                if c.choices and c.choices[0].delta.tool_calls]
    assert "".join(call.function.arguments for calls in streamed for call in calls) == \
        whole.message.tool_calls[0].function.arguments  # fragments, as OpenAI streams them
