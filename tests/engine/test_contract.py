"""The one request contract (engine.contract): what the gateway and the engine server both accept and refuse."""

import pytest

from engine.contract import ContractError, fit_completion, parse_json, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = [  # (kind, body, param, code): refused alike on both sides
    ("completion", {"model": "m", "prompt": "\ud800"}, "prompt", "invalid_request"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "\udfff x"}]}, "messages[0].content",
     "invalid_request"),
    ("completion", {"model": "m", "prompt": [1, -2]}, "prompt", "invalid_request"),
    ("completion", {"model": "m", "prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", "invalid_request"),
    ("completion", {"model": "m", "prompt": "x", "echo": True}, "echo", "unsupported_parameter"),
    ("chat", {**CHAT, "tools": []}, "tools", "invalid_request"),
    ("chat", {**CHAT, "logit_bias": {}}, "logit_bias", "unsupported_parameter"),
    ("chat", {**CHAT, "tool_choice": "required"}, "tool_choice", "invalid_request"),
    ("chat", {**CHAT, "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ("chat", {**CHAT, "stream": 1}, "stream", "invalid_type"),
    ("chat", {"model": "m"}, "messages", "missing_required_parameter"),
    ("completion", {"model": "m", "prompt": ["a"] * 5, "n": 4}, "n", "invalid_request"),
    ("chat", {**CHAT, "top_logprobs": 3}, "top_logprobs", "invalid_request"),
]


@pytest.mark.parametrize("kind, body, param, code", REFUSED)
@pytest.mark.parametrize("trusted", [False, True])
def test_the_gateway_and_the_engine_refuse_alike(kind, body, param, code, trusted):
    with pytest.raises(ContractError) as caught:
        parse_request(kind, body, trusted=trusted)
    assert (caught.value.param, caught.value.code, caught.value.status) == (param, code, 400)


@pytest.mark.parametrize("field, value", [("adapter", {"id": "a"}), ("cache_salt", "s"), ("fairness_key", "k")])
def test_engine_extensions_are_unknown_fields_unless_trusted(field, value):
    with pytest.raises(ContractError) as caught:
        parse_request("chat", {**CHAT, field: value})
    assert caught.value.code == "unknown_parameter"
    parsed = parse_request("chat", {**CHAT, field: value}, trusted=True)
    assert getattr(parsed, field) is not None


def test_a_request_is_read_into_one_shape():
    parsed = parse_request("chat", {**CHAT, "messages": [{"role": "developer", "content": [
        {"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]}], "max_completion_tokens": 5,
        "max_tokens": 9, "logprobs": True, "top_logprobs": 2, "n": 2, "stop": "x", "seed": 1})
    assert parsed.messages == [{"role": "system", "content": "be brief"}]
    assert (parsed.max_tokens, parsed.max_tokens_field, parsed.logprobs, parsed.num_choices) == (
        5, "max_completion_tokens", 2, 2)
    assert parsed.sampling == {"logprobs": 2, "stop": ["x"], "n": 2, "seed": 1}
    ids = parse_request("chat", {"model": "m", "prompt_token_ids": [4, 5]}, trusted=True)
    assert ids.prompt_token_ids == [4, 5] and ids.messages is None
    with pytest.raises(ContractError, match="not valid JSON"):
        parse_json(b"[1,")


def test_fit_completion_is_the_one_length_check():
    assert fit_completion([10, 500], None, 512) == 12  # all the room after the longest prompt
    assert fit_completion([10], 100, 512) == 100
    with pytest.raises(ContractError) as over:
        fit_completion([500], 13, 512, max_tokens_field="max_completion_tokens")
    assert (over.value.status, over.value.code, over.value.param) == (413, "context_length_exceeded",
                                                                      "max_completion_tokens")
    with pytest.raises(ContractError) as full:
        fit_completion([512], None, 512, prompt_field="messages")
    assert full.value.param == "messages"


def test_response_format_and_structured_outputs_become_one_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    by_format = parse_request("chat", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    by_extension = parse_request("completion", {"model": "m", "prompt": "p", "structured_outputs": {"json": schema}})
    assert by_format.sampling["structured_outputs"].key() == by_extension.sampling["structured_outputs"].key()
    assert parse_request("chat", {**CHAT, "response_format": {"type": "json_object"}}).sampling[
        "structured_outputs"].kind == "json_object"
    assert "structured_outputs" not in parse_request("chat", {**CHAT, "response_format": {"type": "text"}}).sampling
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ContractError, match="deeper than"):
        parse_request("chat", {**CHAT, "structured_outputs": {"json": deep}})


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}}]


def test_forced_tool_choices_constrain_the_output_to_calls():
    required = parse_request("chat", {**CHAT, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    schema = required.sampling["structured_outputs"].schema
    assert schema["type"] == "array" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    named = parse_request("chat", {**CHAT, "tools": TOOLS,
                                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.sampling["structured_outputs"].schema == TOOLS[0]["function"]["parameters"]
    assert [s["properties"]["name"] for s in named.tools.call_schemas()] == [{"const": "get_weather"}]
    assert schema["items"]["anyOf"] == required.tools.call_schemas()  # each call: name first, then arguments
    assert list(schema["items"]["anyOf"][0]["properties"]) == ["name", "arguments"]
    assert required.tools.names == {"get_weather", "now"}
    for choice in ("auto", "none", None):
        body = {**CHAT, "tools": TOOLS, **({} if choice is None else {"tool_choice": choice})}
        parsed = parse_request("chat", body)
        assert "structured_outputs" not in parsed.sampling and parsed.tools.choice == (choice or "auto")


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS * 2, "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}]},
     "messages[0].tool_calls"),
])
def test_bad_tools_are_refused_by_field(body, param):
    with pytest.raises(ContractError) as caught:
        parse_request("chat", {**CHAT, **body})
    assert caught.value.param == param


def test_a_conversation_with_tool_calls_and_results_reads_as_text_turns():
    parsed = parse_request("chat", {"model": "m", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"x"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    assert parsed.messages[1]["content"] == '[{"name": "get_weather", "arguments": "{\\"city\\":\\"x\\"}"}]'
    assert parsed.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
