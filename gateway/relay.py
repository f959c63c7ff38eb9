"""Relaying an engine's SSE stream: to a streaming client event by event, or collected into one response.

The engine always streams with cumulative usage in every chunk. Each chunk is rewritten for the client (its
``model`` is the name the client used, never the engine's opaque adapter id; ``usage`` only as the client
asked) and sent the moment it arrives. However the stream ends, the meter is finished exactly once: ``ok`` at
``[DONE]``, ``error`` when the engine fails or falls silent (the client then gets an error event and
``[DONE]``, never a hung stream), ``cancelled`` when the client goes away (the engine request is then aborted
by closing its connection).
"""

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx

from engine.contract import OpenAIRequest
from gateway import metrics
from gateway.errors import GatewayError
from gateway.metering import CANCELLED, ERROR, OK, Meter, spawn
from gateway.replicas import Replica, ReplicaPool

DONE = b"data: [DONE]\n\n"


class Relay:
    def __init__(self, parsed: OpenAIRequest, model: str, meter: Meter, response: httpx.Response,
                 replica: Replica, pool: ReplicaPool, affinity_key: str | None = None):
        self.parsed = parsed
        self.model = model
        self.meter = meter
        self.response = response
        self.replica = replica
        self.pool = pool
        self.affinity_key = affinity_key
        self._first_token_seen = False
        self._last_chunk: dict | None = None
        self._started = False
        self._closed = False
        self._start_timer: asyncio.TimerHandle | None = None
        pool.opened(replica, affinity_key)  # its load estimate (and its adapter's), until this request ends
        metrics.streams_open.inc()

    def watch_start(self, deadline_s: float) -> None:
        """End the request if the stream is not being read within ``deadline_s``: a client that disconnects
        after the view returned but before the server began sending never starts :meth:`events`, whose
        cleanup would then never run."""
        self._start_timer = asyncio.get_running_loop().call_later(deadline_s, self.abandon)

    def abandon(self) -> None:
        """End the request now if its stream was never started (the client left before the answer went out)."""
        if not self._started and not self._closed:
            spawn(self._abandon())

    async def _abandon(self) -> None:
        await self._close()
        await self.meter.finish(CANCELLED)

    async def _batches(self) -> AsyncIterator[list[dict]]:
        """The engine's chunks up to ``[DONE]``, as many at a time as one network read brought (several when the
        gateway fell behind: they then go out in one write); GatewayError when the engine fails or times out."""
        done, pending = False, b""
        try:
            # The transport's bytes, split here: httpx's aiter_raw and aiter_lines stack more async generators
            # on every chunk.
            async for data in self.response.stream:
                *lines, pending = (pending + data).split(b"\n")
                batch = []
                for line in lines:
                    if done or not line.startswith(b"data: "):
                        continue  # after [DONE]: read to the body's end, so the connection is reused
                    if line.startswith(b"data: [DONE]"):
                        done = True
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        if batch:
                            yield batch
                        raise _engine_stream_error(chunk["error"])
                    batch.append(chunk)
                if batch:
                    yield batch
            if done:
                return
        except httpx.TimeoutException:
            metrics.engine_errors_total.labels(kind="timeout").inc()
            raise GatewayError(504, "The engine stopped answering; the request was ended.",
                               code="engine_timeout") from None
        except (httpx.TransportError, ValueError):
            metrics.engine_errors_total.labels(kind="stream_broken").inc()
            self.pool.mark_down(self.replica)  # re-checked at the next health refresh
            raise GatewayError(502, "The engine serving this request failed; the request was ended.",
                               code="engine_failed") from None
        metrics.engine_errors_total.labels(kind="stream_broken").inc()
        raise GatewayError(502, "The engine's stream ended early; the request was ended.", code="engine_failed")

    def _note(self, chunk: dict) -> None:
        self._last_chunk = chunk
        self.meter.observe(chunk.get("usage"))
        if not self._first_token_seen and self.meter.completion_tokens > 0:
            self._first_token_seen = True
            metrics.ttft_seconds.observe(time.monotonic() - self.meter.started_at)

    def _client_chunk(self, chunk: dict) -> bytes | None:
        if not chunk.get("choices"):  # the engine's closing usage chunk
            if not self.parsed.include_usage:
                return None
        elif not self.parsed.continuous_usage:
            if self.parsed.include_usage:
                chunk["usage"] = None  # OpenAI's shape: null on every chunk but the last
            else:
                chunk.pop("usage", None)
        chunk["model"] = self.model
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def events(self) -> AsyncIterator[bytes]:
        """The client's SSE stream."""
        self._started = True
        if self._start_timer is not None:
            self._start_timer.cancel()
        if self._closed:  # abandoned: nobody read it in time
            return
        status, failure = ERROR, None
        try:
            try:
                async for batch in self._batches():
                    events = []
                    for chunk in batch:
                        self._note(chunk)  # counted as relayed: it is handed to the server right below
                        event = self._client_chunk(chunk)
                        if event is not None:
                            events.append(event)
                    if events:
                        yield b"".join(events)
            except GatewayError as exc:
                failure = exc
            except (asyncio.CancelledError, GeneratorExit):  # the client went away
                status = CANCELLED
                raise
            await self._close()
            status = OK if failure is None else ERROR
            await self.meter.settle(status)  # before [DONE]: once the client has it, its quota is corrected
            if failure is not None:
                if self.parsed.include_usage:  # what is billed, as the stream would have ended with it
                    yield self._usage_event()
                yield failure.sse_event()
            yield DONE
        finally:  # the usage row is written after [DONE], while the server still holds the request
            await self._close()
            await self.meter.finish(status)

    def _usage_event(self) -> bytes:
        last = self._last_chunk or {}
        prompt, completion = self.meter.prompt_tokens, self.meter.completion_tokens
        chunk = {"id": last.get("id", self.meter.request_id),
                 "object": last.get("object", "chat.completion.chunk" if self.parsed.kind == "chat"
                                    else "text_completion"),
                 "created": last.get("created", int(time.time())), "model": self.model, "choices": [],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}}
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    async def collect(self) -> dict:
        """The whole response of a non-streaming request, in OpenAI's shape."""
        choices: dict[int, dict] = {}
        created, status = int(time.time()), ERROR
        try:
            async for batch in self._batches():
                for chunk in batch:
                    self._note(chunk)
                    created = chunk.get("created", created)
                    for delta in chunk.get("choices") or ():
                        _merge_choice(choices.setdefault(delta["index"], {"text": [], "finish_reason": None,
                                                                          "logprobs": None, "tool_calls": {}}),
                                      delta)
            status = OK
        except asyncio.CancelledError:
            status = CANCELLED
            raise
        finally:
            await self._close()
            await self.meter.finish(status)
        return _response_body(self.parsed.kind, self.meter, self.model, created, choices)

    async def _close(self) -> None:
        """Close the engine stream; mid-generation this drops the connection, which aborts the engine request."""
        if self._closed:
            return
        self._closed = True
        self.pool.closed(self.replica, self.affinity_key)
        metrics.streams_open.dec()
        try:
            await self.response.aclose()
        except httpx.HTTPError:
            pass


def _engine_stream_error(error) -> GatewayError:
    error = error if isinstance(error, dict) else {}
    metrics.engine_errors_total.labels(kind="stream_error").inc()
    message = error.get("message") if isinstance(error.get("message"), str) else "the engine failed"
    return GatewayError(502, f"The engine failed during generation: {message}",
                        code=error.get("code") if isinstance(error.get("code"), str) else "engine_failed")


def _merge_choice(state: dict, delta: dict) -> None:
    text = delta["delta"].get("content") if "delta" in delta else delta.get("text")
    if text:
        state["text"].append(text)
    for call in delta.get("delta", {}).get("tool_calls") or ():
        _merge_tool_call(state["tool_calls"], call)
    if delta.get("finish_reason"):
        state["finish_reason"] = delta["finish_reason"]
    new = delta.get("logprobs")
    if new:
        if state["logprobs"] is None:
            state["logprobs"] = {key: list(value) if isinstance(value, list) else value for key, value in new.items()}
        else:
            for key, value in new.items():
                if isinstance(value, list):
                    state["logprobs"].setdefault(key, []).extend(value)


def _merge_tool_call(calls: dict[int, dict], delta: dict) -> None:
    """OpenAI's accumulation of tool-call deltas: a call's first delta has its id, type and name; later ones
    append fragments to its ``arguments``."""
    function = delta.get("function") or {}
    fragment = function.get("arguments") or ""
    call = calls.get(delta["index"])
    if call is None:
        calls[delta["index"]] = {"id": delta.get("id"), "type": delta.get("type", "function"),
                                 "function": {"name": function.get("name"), "arguments": fragment}}
    else:
        call["function"]["arguments"] += fragment


def _response_body(kind: str, meter: Meter, model: str, created: int, choices: dict[int, dict]) -> dict:
    out = []
    for index in sorted(choices):
        state = choices[index]
        text = "".join(state["text"])
        entry = {"index": index}
        if kind == "chat" and state["tool_calls"]:
            calls = [state["tool_calls"][i] for i in sorted(state["tool_calls"])]
            entry["message"] = {"role": "assistant", "content": text or None, "tool_calls": calls}
        elif kind == "chat":
            entry["message"] = {"role": "assistant", "content": text}
        else:
            entry["text"] = text
        entry.update(logprobs=state["logprobs"], finish_reason=state["finish_reason"] or "stop")
        out.append(entry)
    usage = {"prompt_tokens": meter.prompt_tokens, "completion_tokens": meter.completion_tokens,
             "total_tokens": meter.prompt_tokens + meter.completion_tokens}
    return {"id": meter.request_id, "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created, "model": model, "choices": out, "usage": usage}
