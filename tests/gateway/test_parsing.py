"""The gateway's checks of a client's request, before anything is counted or reserved, and the engine's body."""

import json

import pytest

from gateway.errors import GatewayError
from gateway.parsing import engine_body, parse_request, tokenize_bodies


def parse(kind: str, **body):
    return parse_request(kind, json.dumps(body).encode())


def refusal(kind: str, **body) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(kind, **body)
    assert caught.value.status == 400
    return caught.value


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("field", ["function_call", "logit_bias", "functions", "response_format_x"])
def test_unsupported_and_unknown_fields_are_400s_naming_the_field(field):
    error = refusal("chat", **CHAT, **{field: {"x": 1}})
    assert error.param == field and f"'{field}'" in error.message
    assert error.code == ("unknown_parameter" if field == "response_format_x" else "unsupported_parameter")


@pytest.mark.parametrize("field", ["adapter", "fairness_key", "fairness_weight", "priority", "cache_salt",
                                   "prompt_token_ids"])
def test_clients_cannot_send_the_engine_only_extensions(field):
    assert refusal("chat", **CHAT, **{field: "x"}).param == field


@pytest.mark.parametrize("field, value", [("max_tokens", True), ("max_tokens", "5"), ("temperature", "hot"),
                                          ("stream", 1), ("model", 3), ("messages", "hi")])
def test_wrong_types_are_400s_naming_the_field(field, value):
    assert refusal("chat", **{**CHAT, field: value}).param == field


def test_missing_fields_and_bad_values():
    assert refusal("chat", model="tiny").param == "messages"
    assert refusal("completion", prompt="x").param == "model"
    assert refusal("completion", model="tiny", prompt=[]).param == "prompt"
    assert refusal("completion", model="tiny", prompt=[["a"]]).param == "prompt"
    assert refusal("chat", **CHAT, max_tokens=0).param == "max_tokens"
    assert refusal("chat", **{**CHAT, "messages": []}).param == "messages"
    assert refusal("completion", model="tiny", prompt=["a", "b", "c", "d"], n=5).param == "n"
    assert refusal("chat", **CHAT, stream_options={"include_usage": True}).param == "stream_options"
    assert refusal("chat", **CHAT, stream=True, stream_options={"x": True}).param == "stream_options"
    with pytest.raises(GatewayError) as caught:
        parse_request("chat", b"{not json")
    assert caught.value.code == "invalid_json"


def test_prompt_forms_and_choices():
    assert parse("completion", model="m", prompt="a").prompts == ["a"]
    assert parse("completion", model="m", prompt=[5, 6, 7]).prompts == [[5, 6, 7]]
    two = parse("completion", model="m", prompt=["a", "b"], n=3)
    assert two.prompts == ["a", "b"] and two.num_choices == 6
    assert tokenize_bodies(two) == [{"prompt": "a"}, {"prompt": "b"}]
    chat = parse("chat", **CHAT, max_completion_tokens=7)
    assert chat.max_tokens == 7 and tokenize_bodies(chat) == [{"messages": CHAT["messages"]}]


def test_the_engine_always_streams_with_cumulative_usage_whatever_the_client_asked():
    parsed = parse("chat", **CHAT, stream=False, max_completion_tokens=9, user="u1", metadata={"a": "b"},
                   temperature=0.5, ignore_eos=True)
    assert not parsed.stream and not parsed.include_usage
    body = engine_body(parsed, [[5, 6, 7]], engine_model="adp_x_v1", max_tokens=9, adapter={"id": "adp_x_v1"},
                       fairness_key="f", fairness_weight=3, priority="batch", cache_salt="s")
    assert body == {"prompt_token_ids": [5, 6, 7], "temperature": 0.5, "ignore_eos": True, "model": "adp_x_v1",
                    "max_tokens": 9, "stream": True, "fairness_key": "f", "fairness_weight": 3,
                    "priority": "batch", "cache_salt": "s",
                    "adapter": {"id": "adp_x_v1"},
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    two = engine_body(parse("completion", model="m", prompt=["a", "b"]), [[1], [2, 3]], engine_model="m",
                      max_tokens=1, adapter=None, fairness_key="f", fairness_weight=1, priority="interactive",
                      cache_salt="s")
    assert two["prompt"] == [[1], [2, 3]]  # the ids the engine's /tokenize gave: encoded once
    streamed = parse("completion", model="m", prompt="a", stream=True, stream_options={"include_usage": True})
    assert streamed.stream and streamed.include_usage and not streamed.continuous_usage


@pytest.mark.parametrize("kind, field, value", [
    ("completion", "stop_token_ids", list(range(200_000))),  # 1.5 MB of ids: refused before it goes anywhere
    ("completion", "stop_token_ids", list(range(257))),
    ("completion", "stop_token_ids", [1, -2]),
    ("completion", "stop_token_ids", [True]),
    ("completion", "stop", ["s"] * 17),
    ("completion", "stop", "s" * 513),
    ("completion", "stop", ""),
    ("completion", "prompt", list(range(131_073))),
    ("completion", "prompt", [[1, 2], [2**31]]),
    ("chat", "messages", [{"role": "user", "content": "x"}] * 2049),
])
def test_list_fields_are_bounded_with_clear_400s(kind, field, value):
    base = CHAT if kind == "chat" else {"model": "tiny", "prompt": "x"}
    error = refusal(kind, **{**base, field: value})
    assert error.param == field and len(error.message) < 300


def test_lists_at_their_bounds_are_accepted():
    parsed = parse("completion", model="tiny", prompt=list(range(131_072)), stop=["s" * 512] * 16,
                   stop_token_ids=list(range(256)))
    assert len(parsed.prompts[0]) == 131_072
    assert len(parse("chat", model="tiny", messages=[{"role": "user", "content": "x"}] * 2048).body["messages"]) \
        == 2048


def test_errors_quote_only_an_excerpt_of_the_clients_input():
    error = refusal("chat", **CHAT, **{"x" * 100_000: 1})
    assert error.code == "unknown_parameter" and len(error.message) < 200 and len(error.param) < 100
    error = refusal("chat", **CHAT, stream=True, stream_options={"y" * 100_000: True})
    assert len(error.message) < 200
