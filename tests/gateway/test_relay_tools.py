"""Tool-call deltas through the gateway's relay: a stream passes them to the client unchanged, and a
non-streaming answer collected from the engine's stream joins each call's fragments as OpenAI clients do."""

import asyncio
import json

from tests.gateway.test_relay import DONE, drain, open_relay, sse_bodies, usage_chunk

MESSAGES = [{"role": "user", "content": "weather?"}]
DELTAS = [  # what the engine streams for "Let me check." then two calls (engine.server.generation)
    {"content": "Let me check."},
    {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "now", "arguments": ""}}]},
    {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    {},
]


def engine_parts() -> list[bytes]:
    parts = []
    for i, delta in enumerate(DELTAS):
        finish = "tool_calls" if i == len(DELTAS) - 1 else None
        body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "adp_secret_v1",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                "usage": {"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": i + 6}}
        parts.append(f"data: {json.dumps(body)}\n\n".encode())
    return [*parts, usage_chunk(len(DELTAS)), DONE]


def test_streamed_tool_call_deltas_reach_the_client_unchanged():
    async def scenario():
        relay, meter, _, _, _ = await open_relay(engine_parts(), messages=MESSAGES, stream=True)
        return sse_bodies(await drain(relay)), meter.finishes

    bodies, finishes = asyncio.run(scenario())
    chunks = [b for b in bodies if b != "[DONE]"]
    assert [c["choices"][0]["delta"] for c in chunks] == DELTAS
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["model"] == "my-bot"
    assert finishes == [("ok", 5, len(DELTAS))]


def test_a_collected_answer_joins_each_calls_fragments():
    async def scenario():
        relay, _, _, _, _ = await open_relay(engine_parts(), messages=MESSAGES)
        return await relay.collect()

    choice = asyncio.run(scenario())["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}
