"""Relaying an engine's SSE stream: chunks rewritten for the client, the meter finished exactly once with the
usage relayed so far, whatever ends the stream (its end, an engine failure, the client going away)."""

import asyncio
import json

import httpx

from gateway.errors import GatewayError
from gateway.parsing import parse_request
from gateway.relay import Relay
from gateway.replicas import Replica


def engine_chunk(text: str, completion_tokens: int, *, finish=None, prompt_tokens=5, chat=False) -> bytes:
    choice = ({"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish} if chat else
              {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    body = {"id": "cmpl-1", "object": "x", "created": 7, "model": "adp_secret_v1", "choices": [choice],
            "usage": usage}
    return f"data: {json.dumps(body)}\n\n".encode()


def usage_chunk(completion_tokens: int, prompt_tokens=5) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    return f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'model': 'x', 'usage': usage})}\n\n".encode()


DONE = b"data: [DONE]\n\n"


class EngineStream(httpx.AsyncByteStream):
    """The engine's body: ``parts`` in order (an exception is raised where it stands), a pause between parts."""

    def __init__(self, parts, pause=0.0):
        self.parts, self.pause, self.closed = parts, pause, False

    async def __aiter__(self):
        for part in self.parts:
            if isinstance(part, Exception):
                raise part
            yield part
            await asyncio.sleep(self.pause)

    async def aclose(self):
        self.closed = True


class FakeMeter:
    def __init__(self):
        self.request_id, self.started_at = "cmpl-1", 0.0
        self.prompt_tokens = self.completion_tokens = 0
        self.finishes: list[tuple[str, int, int]] = []

    def observe(self, usage):
        if usage:
            self.prompt_tokens, self.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]

    async def finish(self, status):
        if not self.finishes:
            self.finishes.append((status, self.prompt_tokens, self.completion_tokens))

    async def settle(self, status):  # the settle is what the fake records; the row follows it
        await self.finish(status)


class FakePool:
    def __init__(self):
        self.down = []

    def mark_down(self, replica):
        self.down.append(replica.url)

    def opened(self, replica, affinity_key):
        replica.in_flight += 1

    def closed(self, replica, affinity_key):
        replica.in_flight -= 1


async def open_relay(parts, *, pause=0.0, **client_body):
    kind = "chat" if "messages" in client_body else "completion"
    body = {"model": "my-bot", **({"prompt": "hi"} if kind == "completion" else {}), **client_body}
    parsed = parse_request(kind, json.dumps(body).encode())
    stream = EngineStream(parts, pause)
    response = httpx.Response(200, stream=stream, request=httpx.Request("POST", "http://e/v1/completions"))
    meter, pool, replica = FakeMeter(), FakePool(), Replica("http://e")
    return Relay(parsed, "my-bot", meter, response, replica, pool), meter, pool, stream, replica


def sse_bodies(events: list[bytes]) -> list:
    out = []
    for event in events:
        data = event.decode().removeprefix("data: ").strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def drain(relay) -> list[bytes]:
    return [event async for event in relay.events()]


def test_chunks_are_rewritten_for_the_client_and_the_meter_finishes_ok_before_done():
    parts = [engine_chunk("a", 1), engine_chunk("b", 2, finish="length"), usage_chunk(2), DONE]

    async def scenario():
        results = {}
        for name, options in {"plain": {}, "usage": {"include_usage": True},
                              "continuous": {"include_usage": True, "continuous_usage_stats": True}}.items():
            relay, meter, _, stream, replica = await open_relay(parts, stream=True, stream_options=options or None)
            events = []
            async for event in relay.events():
                events.append((event, list(meter.finishes)))
            results[name] = (events, meter.finishes, stream.closed, replica.in_flight)
        return results

    results = asyncio.run(scenario())
    plain, _, _, in_flight = results["plain"]
    bodies = sse_bodies([event for event, _ in plain])
    assert [b["choices"][0]["text"] for b in bodies[:-1]] == ["a", "b"] and bodies[-1] == "[DONE]"
    assert all(b["model"] == "my-bot" and "usage" not in b for b in bodies[:-1])  # the opaque id never leaks
    assert plain[-1][1] == [("ok", 5, 2)] and plain[-2][1] == []  # settled before [DONE] went out
    assert in_flight == 0
    usage = sse_bodies([event for event, _ in results["usage"][0]])
    assert [b["usage"] for b in usage[:2]] == [None, None] and usage[2]["usage"]["completion_tokens"] == 2
    continuous = sse_bodies([event for event, _ in results["continuous"][0]])
    assert [b["usage"]["completion_tokens"] for b in continuous[:3]] == [1, 2, 2]


def test_an_engine_dying_mid_stream_ends_with_an_error_event_and_meters_what_was_relayed():
    parts = [engine_chunk("a", 1), engine_chunk("b", 2), httpx.ReadError("connection reset")]

    async def scenario():
        relay, meter, pool, stream, _ = await open_relay(parts, stream=True)
        return await drain(relay), meter.finishes, pool.down, stream.closed

    events, finishes, down, closed = asyncio.run(scenario())
    bodies = sse_bodies(events)
    assert bodies[-1] == "[DONE]" and bodies[-2]["error"]["code"] == "engine_failed"
    assert finishes == [("error", 5, 2)] and down == ["http://e"]


def test_a_client_that_asked_for_usage_gets_what_is_billed_before_the_error():
    parts = [engine_chunk("a", 1, chat=True), engine_chunk("b", 2, chat=True), httpx.ReadError("connection reset")]

    async def scenario():
        relay, meter, _, _, _ = await open_relay(parts, stream=True, messages=[{"role": "user", "content": "hi"}],
                                                 stream_options={"include_usage": True})
        return sse_bodies(await drain(relay)), meter.finishes

    bodies, finishes = asyncio.run(scenario())
    assert bodies[-1] == "[DONE]" and bodies[-2]["error"]["code"] == "engine_failed"
    usage = bodies[-3]
    assert usage["choices"] == [] and usage["model"] == "my-bot" and usage["id"] == "cmpl-1"
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert finishes == [("error", 5, 2)]  # the same counts as billed


def test_an_error_event_or_a_truncated_stream_from_the_engine_is_an_error():
    error = b'data: {"error": {"message": "boom", "type": "internal_error", "code": "internal_error"}}\n\n'

    async def scenario(parts):
        relay, meter, _, _, _ = await open_relay(parts, stream=True)
        return sse_bodies(await drain(relay)), meter.finishes

    bodies, finishes = asyncio.run(scenario([engine_chunk("a", 1), error, DONE]))
    assert "boom" in bodies[-2]["error"]["message"] and finishes == [("error", 5, 1)]
    bodies, finishes = asyncio.run(scenario([engine_chunk("a", 1)]))  # no [DONE]: the engine went away
    assert bodies[-2]["error"]["code"] == "engine_failed" and finishes == [("error", 5, 1)]


def test_a_client_going_away_closes_the_engine_stream_and_meters_what_it_was_sent():
    parts = [engine_chunk(str(i), i) for i in range(1, 50)] + [DONE]

    async def scenario():
        relay, meter, _, stream, replica = await open_relay(parts, pause=0.01, stream=True)
        events = relay.events()
        received = [await anext(events) for _ in range(3)]
        await events.aclose()  # what the server does when the client disconnects
        return received, meter.finishes, stream.closed, replica.in_flight

    received, finishes, closed, in_flight = asyncio.run(scenario())
    assert len(received) == 3 and finishes == [("cancelled", 5, 3)] and closed and in_flight == 0


def test_a_stream_nobody_starts_reading_is_ended_and_metered():
    async def scenario():
        relay, meter, _, stream, replica = await open_relay([engine_chunk("a", 1), DONE], stream=True)
        relay.watch_start(0.05)
        await asyncio.sleep(0.2)
        late = await drain(relay)
        return meter.finishes, stream.closed, replica.in_flight, late

    finishes, closed, in_flight, late = asyncio.run(scenario())
    assert finishes == [("cancelled", 0, 0)] and closed and in_flight == 0 and late == []


def test_a_non_streaming_answer_is_collected_from_the_stream():
    lp = {"content": [{"token": "a", "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
    first = json.loads(engine_chunk("Hel", 1, chat=True)[6:])
    first["choices"][0]["logprobs"] = lp
    parts = [f"data: {json.dumps(first)}\n\n".encode(), engine_chunk("lo", 2, chat=True, finish="stop"),
             usage_chunk(2), DONE]

    async def scenario():
        relay, meter, _, _, _ = await open_relay(parts, messages=[{"role": "user", "content": "hi"}], logprobs=True)
        return await relay.collect(), meter.finishes

    body, finishes = asyncio.run(scenario())
    assert body["object"] == "chat.completion" and body["model"] == "my-bot"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                "logprobs": lp, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert finishes == [("ok", 5, 2)]


def test_chunks_that_arrive_together_go_out_together_and_lines_split_across_reads_are_joined():
    together = engine_chunk("a", 1) + engine_chunk("b", 2) + engine_chunk("c", 3)
    split = engine_chunk("d", 4, finish="length")
    parts = [together, split[:20], split[20:], DONE]

    async def scenario():
        relay, meter, _, _, _ = await open_relay(parts, stream=True)
        return await drain(relay), meter.finishes

    events, finishes = asyncio.run(scenario())
    assert len(events) == 3  # one write for the three that came in one read, one for "d", one for [DONE]
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[0].split(b"\n\n") if e]
    assert texts == ["a", "b", "c"] and json.loads(events[1][6:])["choices"][0]["text"] == "d"
    assert finishes == [("ok", 5, 4)]


def test_an_engine_that_falls_silent_ends_the_stream_with_a_timeout_error():
    async def scenario():
        relay, meter, _, _, _ = await open_relay([engine_chunk("a", 1), httpx.ReadTimeout("silent")], stream=True)
        return sse_bodies(await drain(relay)), meter.finishes

    bodies, finishes = asyncio.run(scenario())
    assert bodies[-2]["error"]["code"] == "engine_timeout" and bodies[-1] == "[DONE]"
    assert finishes == [("error", 5, 1)]


def test_a_non_streaming_request_whose_engine_fails_is_an_error_metered_for_its_tokens():
    async def scenario():
        relay, meter, _, _, _ = await open_relay([engine_chunk("a", 1), engine_chunk("b", 2),
                                                  httpx.RemoteProtocolError("peer closed")])
        try:
            await relay.collect()
        except GatewayError as exc:
            return exc, meter.finishes

    error, finishes = asyncio.run(scenario())
    assert (error.status, error.code) == (502, "engine_failed") and finishes == [("error", 5, 2)]


def test_a_client_leaving_while_the_rate_headers_are_added_ends_the_stream_opened_for_it(monkeypatch):
    """The view opened the engine stream; the client goes away while the endpoint adds its x-ratelimit headers:
    the engine request ends and is metered now, not at the start deadline."""
    import pytest
    from django.http import StreamingHttpResponse

    from gateway import views

    async def leaving(response, caller):
        raise asyncio.CancelledError

    monkeypatch.setattr(views, "_add_rate_headers", leaving)

    async def scenario():
        relay, meter, _, stream, replica = await open_relay([engine_chunk("a", 1), DONE], stream=True)
        response = StreamingHttpResponse(relay.events(), content_type="text/event-stream")
        response.relay = relay

        async def view(request, state):
            state["caller"] = "someone"
            return response

        class Request:
            method = "POST"

        with pytest.raises(asyncio.CancelledError):
            await views.openai_endpoint("completions", "POST")(view)(Request())
        await asyncio.sleep(0.05)
        return meter.finishes, stream.closed, replica.in_flight

    finishes, closed, in_flight = asyncio.run(scenario())
    assert finishes == [("cancelled", 0, 0)] and closed and in_flight == 0
