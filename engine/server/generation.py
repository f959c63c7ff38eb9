"""Running one completion or chat request on the async engine: whole responses and SSE streams.

Usage is cumulative: with ``stream_options.continuous_usage_stats`` every chunk carries the tokens produced
so far (held-back stop-string tokens included), so a stream cut anywhere has an exact count.

With tools, each choice's text goes through its tool-call parser (``engine.server.tool_formats``): a stream sends
content deltas for the text before a call, then OpenAI's tool-call deltas (a call's index, id, type and name with
empty arguments, then its arguments as fragments), and a last chunk whose ``finish_reason`` is ``tool_calls``.
"""

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.contract import OpenAIRequest
from engine.server.tool_formats import parser_for
from engine.server.tool_parsers import ToolCallDelta, ToolCallParser


@dataclass(slots=True)
class ChoiceState:
    """What has been sent of one choice (one of the ``n`` samples of one prompt)."""

    index: int
    sent_text: str = ""
    num_tokens: int = 0
    num_logprobs_sent: int = 0
    logprobs_text_offset: int = 0  # the completions' text_offset of the next token with logprobs
    finish_reason: str | None = None
    tool_parser: ToolCallParser | None = None  # chat with tools: reads calls out of the text as it grows


@dataclass(slots=True)
class RequestState:
    request: OpenAIRequest
    request_id: str
    created: int
    prompt_tokens: int = 0
    choices: dict[int, ChoiceState] = field(default_factory=dict)
    first_token_at: float | None = None
    arrived_at: float = field(default_factory=time.monotonic)

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices.values())

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def _object(kind: str, stream: bool) -> str:
    if kind == "chat":
        return "chat.completion.chunk" if stream else "chat.completion"
    return "text_completion"


def _logprobs_payload(kind: str, tokenizer, entries: list, k: int, text_offset: int = 0) -> dict:
    """``entries``: per generated token, ``{token_id: logprob}`` with the sampled token first, then the top ``k``
    (the sampled one only once: ``k`` entries when it is among them, ``k + 1`` otherwise). Chat's ``top_logprobs``
    are the top ``k`` alone (OpenAI); the completions' legacy ``top_logprobs`` hold the sampled token too ("up to
    logprobs + 1 elements"). ``text_offset``: where the first entry's token starts in the completion's text."""
    if kind == "chat":
        content = []
        for entry in entries:
            items = list(entry.items())
            token_id, logprob = items[0]
            top = sorted(items[1:] if len(items) > k else items, key=lambda item: -item[1])
            content.append({**_token_logprob(tokenizer, token_id, logprob),
                            "top_logprobs": [_token_logprob(tokenizer, t, lp) for t, lp in top]})
        return {"content": content}
    tokens, token_logprobs, top, offsets = [], [], [], []
    for entry in entries:
        items = list(entry.items())
        token = tokenizer.decode([items[0][0]])
        tokens.append(token)
        token_logprobs.append(items[0][1])
        top.append({tokenizer.decode([t]): lp for t, lp in items})
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _token_logprob(tokenizer, token_id: int, logprob: float) -> dict:
    token = tokenizer.decode([token_id])
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}


def choice_delta(state: RequestState, prompt_index: int, completion, tokenizer) -> dict | None:
    """The new part of one choice since the last chunk, or None if nothing new."""
    index = prompt_index * state.request.n + completion.index
    choice = state.choices.setdefault(index, ChoiceState(index))
    delta_text = completion.text[len(choice.sent_text):]
    choice.sent_text = completion.text
    choice.num_tokens = len(completion.token_ids)
    new_finish = completion.finish_reason if completion.finish_reason != choice.finish_reason else None
    choice.finish_reason = completion.finish_reason
    logprobs = None
    if state.request.logprobs is not None and completion.logprobs:
        fresh = completion.logprobs[choice.num_logprobs_sent:]
        choice.num_logprobs_sent = len(completion.logprobs)
        if fresh:
            logprobs = _logprobs_payload(state.request.kind, tokenizer, fresh, state.request.logprobs,
                                         choice.logprobs_text_offset)
            if "tokens" in logprobs:
                choice.logprobs_text_offset += sum(len(token) for token in logprobs["tokens"])
    if not delta_text and new_finish is None and logprobs is None:
        return None
    finish = _finish_reason(new_finish)
    if state.request.kind == "chat":
        delta = {"content": delta_text} if delta_text else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "text": delta_text, "logprobs": logprobs, "finish_reason": finish}


def _finish_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    return reason if reason in ("stop", "length") else "stop"


def chunk(state: RequestState, choices: list[dict], *, usage: dict | None = None, with_usage_key: bool) -> str:
    body = {"id": state.request_id, "object": _object(state.request.kind, True), "created": state.created,
            "model": state.request.model, "choices": choices}
    if with_usage_key:
        body["usage"] = usage
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def stream_events(state: RequestState, outputs: AsyncIterator[tuple[int, object]], tokenizer,
                        on_first_token) -> AsyncIterator[str]:
    """SSE ``data:`` lines for one request: role chunk (chat), token chunks, usage chunk, ``[DONE]``."""
    request = state.request
    continuous = request.continuous_usage
    if request.kind == "chat":
        # with tools the message may hold calls alone, whose content is null (as OpenAI streams it)
        content = None if request.tools is not None and request.tools.choice != "none" else ""
        first = [{"index": i, "delta": {"role": "assistant", "content": content}, "logprobs": None,
                  "finish_reason": None} for i in range(request.num_choices)]
        yield chunk(state, first, usage=state.usage() if continuous else None, with_usage_key=continuous)
    template = getattr(tokenizer, "chat_template", None)
    async for prompt_index, completion in outputs:
        choice = choice_delta(state, prompt_index, completion, tokenizer)
        if state.first_token_at is None and state.completion_tokens:
            state.first_token_at = time.monotonic()
            on_first_token()
        if choice is None:
            continue
        parsing = state.choices[choice["index"]]
        if parsing.tool_parser is None and request.kind == "chat":
            parsing.tool_parser = parser_for(request.tools, template)
        pieces = [choice] if parsing.tool_parser is None else _tool_choices(choice, completion, parsing.tool_parser)
        for piece in pieces:
            yield chunk(state, [piece], usage=state.usage() if continuous else None, with_usage_key=continuous)
    if request.include_usage:
        yield chunk(state, [], usage=state.usage(), with_usage_key=True)
    yield "data: [DONE]\n\n"


def full_response(state: RequestState, finals: dict[int, object], tokenizer) -> dict:
    """The non-streaming body from each choice's final output."""
    request = state.request
    choices = []
    for index in sorted(finals):
        completion = finals[index]
        state.choices[index] = ChoiceState(index, completion.text, len(completion.token_ids))
        logprobs = None
        if request.logprobs is not None and completion.logprobs:
            logprobs = _logprobs_payload(request.kind, tokenizer, completion.logprobs, request.logprobs)
        finish = _finish_reason(completion.finish_reason) or "stop"
        content, calls = _tool_calls(request, completion, getattr(tokenizer, "chat_template", None))
        if calls is not None:
            choices.append({"index": index, "message": {"role": "assistant", "content": content,
                                                        "tool_calls": calls},
                            "logprobs": logprobs, "finish_reason": "tool_calls"})
        elif request.kind == "chat":
            choices.append({"index": index, "message": {"role": "assistant", "content": completion.text},
                            "logprobs": logprobs, "finish_reason": finish})
        else:
            choices.append({"index": index, "text": completion.text, "logprobs": logprobs, "finish_reason": finish})
    return {"id": state.request_id, "object": _object(request.kind, False), "created": state.created,
            "model": request.model, "choices": choices, "usage": state.usage()}


def _tool_calls(request: OpenAIRequest, completion, template: str | None) -> tuple[str | None, list[dict] | None]:
    """The content and OpenAI tool_calls of a chat output with tools (calls None when there are none: a call cut
    by max_tokens comes back as its text, with finish_reason "length")."""
    parser = parser_for(request.tools, template) if request.kind == "chat" else None
    if parser is None or completion.finish_reason != "stop":
        return completion.text, None
    return parser.parse(completion.text)


def _tool_choices(choice: dict, completion, parser: ToolCallParser) -> list[dict]:
    """One engine output of a choice as stream choices: content, each call's first delta, arguments fragments,
    and the finish in a chunk of its own. A call cut by max_tokens ends with "length" after what was sent."""
    text = choice["delta"].get("content", "")
    pieces = parser.feed(text) if text else []
    finish = choice["finish_reason"]
    if finish is not None:
        pieces += parser.finish()
    out = [{"index": choice["index"], "delta": delta, "logprobs": None, "finish_reason": None}
           for delta in _deltas(pieces)]
    if choice["logprobs"] is not None:
        if not out:
            out.append({"index": choice["index"], "delta": {}, "logprobs": None, "finish_reason": None})
        out[0]["logprobs"] = choice["logprobs"]
    if finish is not None:
        called = completion.finish_reason == "stop" and parser.valid_calls() is not None
        out.append({"index": choice["index"], "delta": {}, "logprobs": None,
                    "finish_reason": "tool_calls" if called else finish})
    return out


def _deltas(pieces: list[ToolCallDelta]) -> list[dict]:
    """Parser output as OpenAI deltas, runs of content or of one call's arguments joined."""
    deltas: list[dict] = []
    for piece in pieces:
        last = deltas[-1] if deltas else {}
        if piece.content:
            if "content" in last:
                last["content"] += piece.content
            else:
                deltas.append({"content": piece.content})
        elif piece.id is not None:
            deltas.append({"tool_calls": [{"index": piece.index, "id": piece.id, "type": "function",
                                           "function": {"name": piece.name, "arguments": ""}}]})
        elif "tool_calls" in last and last["tool_calls"][0]["index"] == piece.index and \
                "id" not in last["tool_calls"][0]:
            last["tool_calls"][0]["function"]["arguments"] += piece.arguments
        else:
            deltas.append({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.arguments}}]})
    return deltas
