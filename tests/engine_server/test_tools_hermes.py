"""Tool calls in the chat template's own format, end to end through the engine server, on a tiny random Llama
whose tokenizer carries a Hermes-style (Qwen2.5) template.

What this shows, honestly: a random model never writes ``<tool_call>`` by itself, so under ``auto`` it answers
text (checked: content, no calls, the prompt rendered with the tools). The part of ``auto`` that acts after the
trigger, a valid call of a given tool forced in the template's syntax, is the same grammar body and parser that
``required`` and a named function use on this model, so those requests drive it end to end here; the trigger
itself is checked token by token against llguidance in test_tools_parsers.py.
"""

import json

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from transformers import AutoTokenizer

from tests.engine_server.conftest import start_engine
from tests.engine_server.test_tools_parsers import CLOCK, WEATHER
from tests.support.tiny_llama import make_tiny_llama
from tests.support.tool_templates import HERMES_TEMPLATE

MESSAGES = [{"role": "user", "content": "What is the weather in Paris for the next two days?"}]
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "now": CLOCK["function"]["parameters"]}


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory):
    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-hermes"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = HERMES_TEMPLATE
    tokenizer.save_pretrained(folder)
    # the tool prompt is long in the tiny tokenizer: the model's whole 1024 positions
    server = start_engine(folder, tmp_path_factory.mktemp("hermes-logs"), "--no-enable-lora", "--max-model-len", "1024")
    try:
        yield server
    finally:
        server.group.stop()


@pytest.fixture
def client(hermes_server):
    return openai.OpenAI(base_url=f"{hermes_server.url}/v1", api_key=hermes_server.api_key, max_retries=0)


def assert_valid_calls(calls) -> None:
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed(client, **kwargs):
    """The choice as the openai client accumulates a stream (its snapshot: the final form refuses "length")."""
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        state.handle_chunk(chunk)
    return state.current_completion_snapshot.choices[0]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_in_the_template_format_whole_and_streamed(client, tool_choice):
    kwargs = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK], tool_choice=tool_choice, max_tokens=120,
                  temperature=0, parallel_tool_calls=False)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    assert_valid_calls(whole.message.tool_calls)
    assert len(whole.message.tool_calls) == 1
    if tool_choice != "required":
        assert whole.message.tool_calls[0].function.name == "get_weather"
    arguments = whole.message.tool_calls[0].function.arguments
    assert ", " in arguments or arguments == "{}"  # the template's spacing, as such models were trained
    stream = streamed(client, **kwargs)
    assert stream.finish_reason == "tool_calls" and stream.message.content is None
    assert [(c.function.name, c.function.arguments) for c in stream.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_parallel_calls_sampled_are_each_valid(client):
    finishes = []
    for seed in range(4):
        choice = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK],
                                                tool_choice="required", max_tokens=200, temperature=1.0,
                                                seed=seed).choices[0]
        if choice.finish_reason == "tool_calls":
            assert_valid_calls(choice.message.tool_calls)
        else:  # sampling may keep adding calls until max_tokens: then the text comes back, as for any cut call
            assert choice.finish_reason == "length" and choice.message.content.startswith("<tool_call>")
        finishes.append((choice.finish_reason, len(choice.message.tool_calls or ())))
    assert any(f == "tool_calls" for f, _ in finishes), finishes  # not all cut: calls end, one or several


def test_auto_renders_the_tools_into_the_prompt_and_a_text_answer_is_content(client):
    kwargs = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK], max_tokens=24, temperature=0)
    auto = client.chat.completions.create(**kwargs)  # tool_choice auto: OpenAI's default with tools
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, temperature=0)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 100  # the template's tool prompt was rendered
    choice = auto.choices[0]
    if choice.message.tool_calls:  # a random model opening a call by chance: it must then be a valid one
        assert choice.finish_reason == "tool_calls"
        assert_valid_calls(choice.message.tool_calls)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")
    stream = streamed(client, **kwargs)
    assert stream.message.content == choice.message.content and stream.finish_reason == choice.finish_reason


def test_a_conversation_with_calls_and_results_renders_in_the_template_format(client, hermes_server):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}]
    answer = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER], max_tokens=4,
                                            temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with hermes_server.client() as http:
        tokens = http.post("/tokenize", json={"messages": history}).json()["tokens"]
    text = AutoTokenizer.from_pretrained(hermes_server.folder).decode(tokens)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 24 C\n</tool_response>" in text


def test_auto_beside_an_output_constraint_is_refused(hermes_server):
    with hermes_server.client() as http:
        response = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": MESSAGES, "tools": [WEATHER], "response_format": {"type": "json_object"}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"


def test_tokenize_renders_the_tools_as_the_chat_endpoint_does(client, hermes_server):
    """The gateway counts and sends the prompt /tokenize gives: with tools it must be the prompt chat renders."""
    chat = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, CLOCK], max_tokens=1,
                                          temperature=0, tool_choice="required")
    with hermes_server.client() as http:
        with_tools = http.post("/tokenize", json={"messages": MESSAGES, "tools": [WEATHER, CLOCK],
                                                  "tool_choice": "required"}).json()
        without = http.post("/tokenize", json={"messages": MESSAGES}).json()
        refused = http.post("/tokenize", json={"prompt": "hi", "tools": [WEATHER]})
    assert with_tools["count"] == chat.usage.prompt_tokens > without["count"] + 100
    text = AutoTokenizer.from_pretrained(hermes_server.folder).decode(with_tools["tokens"])
    assert '"name": "get_weather"' in text
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
