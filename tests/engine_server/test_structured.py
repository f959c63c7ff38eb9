"""Structured outputs through the engine server with the official `openai` client: response_format (json_object,
json_schema, a Pydantic model through ``chat.completions.parse``) and vLLM's ``structured_outputs`` extension, on
a tiny random Llama: the constraint alone makes the output valid, whatever the weights."""

import json
from typing import Annotated

import jsonschema
import openai
import pydantic
import pytest

MESSAGES = [{"role": "user", "content": "Extract the contact details: Rosa Lind, 34, Tbilisi."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Tbilisi", "Lima"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}


class Contact(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)
    tags: list[Annotated[str, pydantic.Field(max_length=8)]] = pydantic.Field(max_length=2)


@pytest.fixture
def client(engine_server):
    return openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key=engine_server.api_key, max_retries=0)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_output_validates_and_ends_with_stop(client, temperature):
    result = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, temperature=temperature, seed=5, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "contact", "schema": SCHEMA,
                                                                "strict": True}})
    for choice in result.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.finish_reason == "stop"


def test_a_pydantic_model_through_chat_completions_parse(client):
    result = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Contact,
                                           max_tokens=400, temperature=0)
    parsed = result.choices[0].message.parsed
    assert isinstance(parsed, Contact) and len(parsed.tags) <= 2 and 0 <= parsed.age <= 120


def test_json_object_choice_and_regex_on_both_endpoints(client):
    obj = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=60, temperature=0.5, seed=2,
                                         response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:  # a random model may ramble inside its object until max_tokens
        assert obj.choices[0].finish_reason == "length" and obj.choices[0].message.content.startswith("{")
    choice = client.completions.create(model="tiny", prompt="Is it raining?", max_tokens=10, temperature=1.0, n=4,
                                       seed=3, extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
    assert {c.text for c in choice.choices} <= {"yes", "no", "maybe"}
    phone = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, temperature=1.0, seed=4,
                                           extra_body={"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}})
    assert len(phone.choices[0].message.content) == 8 and phone.choices[0].message.content[3] == "-"


def test_streamed_constrained_output_is_the_same_as_whole(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=120, temperature=0,
                  response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(stream=True, **kwargs) if chunk.choices)
    assert streamed == whole and json.loads(streamed)["city"] in SCHEMA["properties"]["city"]["enum"]


def test_a_constraint_cut_by_max_tokens_ends_with_length(client):
    result = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=3, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})
    assert result.choices[0].finish_reason == "length" and result.usage.completion_tokens == 3


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"structured_outputs": {"regex": "[a-", "json_object": True}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}},
     "structured_outputs.json"),
    ({"structured_outputs": {"frob": 1}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": "object"}}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ({"structured_outputs": {"json": {"a": "x" * 70_000}}}, "structured_outputs"),
])
def test_bad_constraints_are_400s_naming_their_field(engine_server, body, param):
    with engine_server.client() as http:
        response = http.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"enum": ["Paris", "Tbilisi"]},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choices_answer_openai_tool_calls(client, tool_choice, stream):
    kwargs = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice=tool_choice, max_tokens=200,
                  temperature=1.0, seed=9, parallel_tool_calls=False)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        calls = [call for c in chunks if c.choices and c.choices[0].delta.tool_calls
                 for call in c.choices[0].delta.tool_calls if call.id]  # each call's first delta
        for call in calls:  # its arguments come as fragments in the deltas after it, as OpenAI streams them
            call.function.arguments = "".join(d.function.arguments for c in chunks if c.choices
                                              for d in c.choices[0].delta.tool_calls or () if d.index == call.index)
        assert all(not (c.choices and c.choices[0].delta.content) for c in chunks)  # no content, only the calls
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        finish, calls = [choice.finish_reason], choice.message.tool_calls
        assert choice.message.content is None
    assert finish == ["tool_calls"] and len(calls) == 1 and calls[0].id.startswith("call_")
    name, arguments = calls[0].function.name, json.loads(calls[0].function.arguments)
    assert name in ({"get_weather", "now"} if tool_choice == "required" else {"get_weather"})
    if name == "get_weather":
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_tool_choice_auto_says_why_it_cannot_serve_and_none_answers_text(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER])  # auto: OpenAI's default
    assert refused.value.body["param"] == "tool_choice" and "required" in refused.value.message
    text = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice="none",
                                          max_tokens=4).choices[0]
    assert text.message.tool_calls is None and text.message.content


# ---------------------------------------------------------------- warm compiles: POST /v1/structured_outputs/compile

TICKET = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^T-[0-9]{4}$"},
                                           "priority": {"enum": ["low", "high"]}},
          "required": ["id", "priority"], "additionalProperties": False}


def _grammar_cache(engine_server) -> dict:
    return engine_server.stats()["structured_outputs"]["grammar_cache"]


def test_a_warm_compile_is_what_a_later_request_with_the_same_schema_and_salt_hits(engine_server):
    with engine_server.client() as http:
        compile_body = {"structured_outputs": {"json": TICKET}, "cache_salt": "tenant-a"}
        first = http.post("/v1/structured_outputs/compile", json=compile_body)
        assert first.status_code == 200, first.text
        assert first.json()["object"] == "structured_outputs.compiled" and first.json()["kind"] == "json"
        assert first.json()["cached"] is False and isinstance(first.json()["compile_ms"], float)
        again = http.post("/v1/structured_outputs/compile", json=compile_body).json()
        assert again["cached"] is True
        warmed = _grammar_cache(engine_server)
        # response_format json_schema (strict too) is {"json": schema}: the same cache key as the warm compile
        chat = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "cache_salt": "tenant-a",
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": TICKET,
                                                                       "strict": True}}})
        assert chat.status_code == 200, chat.text
        served = _grammar_cache(engine_server)
        assert served["misses"] == warmed["misses"] and served["hits"] > warmed["hits"]
        assert served["entries"] == warmed["entries"]
        # another salt (another tenant) is another entry: its compile is its own
        other = http.post("/v1/completions", json={"model": "tiny", "prompt": "Ticket:", "max_tokens": 60,
                                                   "cache_salt": "tenant-b", "structured_outputs": {"json": TICKET}})
        assert other.status_code == 200, other.text
        assert _grammar_cache(engine_server)["misses"] == served["misses"] + 1
        metrics = http.get("/metrics").text
    assert f"engine_structured_outputs_grammar_cache_misses {float(served['misses'] + 1)}" in metrics


def test_a_warm_compile_of_regex_and_choice_without_a_salt(engine_server):
    with engine_server.client() as http:
        for constraint, kind in [({"regex": "[A-Z]{2}-[0-9]{3}"}, "regex"), ({"choice": ["red", "green"]}, "choice")]:
            response = http.post("/v1/structured_outputs/compile", json={"structured_outputs": constraint})
            assert response.status_code == 200, response.text
            assert response.json()["kind"] == kind


def _nested(depth: int) -> dict:
    return {"type": "array", "items": _nested(depth - 1)} if depth else {"type": "integer"}


@pytest.mark.parametrize("body, param, says", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "does not compile"),
    ({"structured_outputs": {"regex": "a^b"}}, "structured_outputs.regex", "does not compile"),
    ({"structured_outputs": {"regex": "x[^\\s\\S]"}}, "structured_outputs.regex", "can match no text"),
    ({"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}}, "structured_outputs.json",
     "uniqueItems"),
    ({"structured_outputs": {"json": {"a": "x" * 70_000}}}, "structured_outputs", "limit"),
    ({"structured_outputs": {"json": _nested(40)}}, "structured_outputs", "deeper"),
    ({"structured_outputs": {"frob": 1}}, "structured_outputs", "frob"),
    ({"structured_outputs": {"json": {"type": "object"}}, "extra": 1}, "extra", "extra"),
    ({"structured_outputs": {"json": {"type": "object"}}, "cache_salt": ""}, "cache_salt", "cache_salt"),
    ({"structured_outputs": "json"}, "structured_outputs", "type"),
    ({}, "structured_outputs", "required"),
])
def test_warm_compile_refusals_are_400s_naming_their_field(engine_server, body, param, says):
    with engine_server.client() as http:
        response = http.post("/v1/structured_outputs/compile", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
