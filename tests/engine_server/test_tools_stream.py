"""Forced tool calls streamed as OpenAI streams them, on the tiny model whose chat template has no tool format
(the output is the contract's JSON): a call's first delta with its id and name, then argument fragments that the
openai client's own accumulation joins into exactly the arguments of the whole response. And ``auto`` refused,
saying why, whether the messages or the gateway's token ids came."""

import json

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from tests.engine_server.test_tools_parsers import CLOCK, WEATHER

MESSAGES = [{"role": "user", "content": "What is the weather in Tbilisi for the next three days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture
def client(engine_server):
    return openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key=engine_server.api_key, max_retries=0)


def raw_chunks(engine_server, body: dict) -> list[dict]:
    """The SSE ``data:`` bodies of one streamed chat request, as sent."""
    chunks = []
    with engine_server.client() as http, http.stream("POST", "/v1/chat/completions",
                                                     json={"model": "tiny", "stream": True, **body}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_streamed_calls_accumulate_to_the_whole_answer(client, tool_choice):
    kwargs = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice=tool_choice, max_tokens=200,
                  temperature=0, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs).choices[0]
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        state.handle_chunk(chunk)
    streamed = state.get_final_completion().choices[0]
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    assert streamed.message.content is None and whole.message.content is None
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    call = whole.message.tool_calls[0]
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    else:
        assert tool_choice == "required" and json.loads(call.function.arguments) == {}


def test_raw_chunks_carry_the_first_delta_then_fragments_then_the_finish(engine_server):
    chunks = raw_chunks(engine_server, {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}, "max_tokens": 200, "temperature": 0})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [call for d in deltas for call in d.get("tool_calls", ())]
    assert calls[0] == {"index": 0, "id": calls[0]["id"], "type": "function",
                        "function": {"name": "get_weather", "arguments": ""}} and calls[0]["id"].startswith("call_")
    fragments = calls[1:]
    assert len(fragments) > 1  # incremental: the arguments come as the tokens are generated
    assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in fragments)
    arguments = "".join(f["function"]["arguments"] for f in fragments)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["tool_calls"] and chunks[-1]["choices"][0]["delta"] == {}
    assert not any(d.get("content") for d in deltas)


def test_a_streamed_call_cut_by_max_tokens_ends_with_length(engine_server):
    chunks = raw_chunks(engine_server, {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required",
                                        "max_tokens": 6, "temperature": 0})
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]


@pytest.mark.parametrize("prompt", ["messages", "prompt_token_ids"])
def test_auto_is_refused_naming_the_reason_on_either_prompt_path(engine_server, prompt):
    with engine_server.client() as http:
        ids = http.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
        body = {"model": "tiny", "tools": [WEATHER], **({"messages": MESSAGES} if prompt == "messages" else
                                                         {"prompt_token_ids": ids})}
        response = http.post("/v1/chat/completions", json=body)  # tool_choice: auto, OpenAI's default
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tool_choice" and error["code"] == "tool_choice_unsupported"
    assert "chat template has no tool-call format" in error["message"] and "'required'" in error["message"]
