"""A client's completion or chat request, checked before anything is reserved, and the body sent to an engine.

The gateway checks every field's name and type (400 naming the field: unsupported OpenAI features are refused,
never ignored) and the values it acts on itself (model, stream, max_tokens, n, prompt); the engine checks the
remaining values (temperature ranges, ...). Lists are bounded here, before anything is counted or sent on, and
errors quote at most an excerpt of what the client sent. Clients cannot send the engine-only extensions
(``adapter``, ``fairness_key``, ``cache_salt``): the gateway sets those.
"""

import json
from dataclasses import dataclass

from gateway.errors import bad_request, excerpt

MAX_CHOICES = 16  # prompts x n of one request (the engine's own cap on n)
MAX_STOPS, MAX_STOP_CHARS = 16, 512  # the engine's cap on stop strings
MAX_STOP_TOKEN_IDS = 256  # the engine's cap
MAX_PROMPT_TOKEN_IDS = 131_072  # per token-id prompt: past any context this platform serves
MAX_TOKEN_ID = 2**31 - 1
MAX_MESSAGES = 2048
_NONE = type(None)
_NUMBER = (int, float, _NONE)

_COMMON = {
    "model": (str,), "max_tokens": (int, _NONE), "temperature": _NUMBER, "top_p": _NUMBER, "n": (int, _NONE),
    "stream": (bool, _NONE), "stream_options": (dict, _NONE), "stop": (str, list, _NONE), "seed": (int, _NONE),
    "presence_penalty": _NUMBER, "frequency_penalty": _NUMBER, "user": (str, _NONE), "metadata": (dict, _NONE),
    # the engine's sampling extensions (vLLM's names)
    "ignore_eos": (bool,), "min_tokens": (int,), "top_k": (int,), "min_p": (int, float),
    "repetition_penalty": (int, float), "stop_token_ids": (list, _NONE),
}
_SPECS = {
    "completion": {**_COMMON, "prompt": (str, list), "logprobs": (int, _NONE), "echo": (bool, _NONE),
                   "best_of": (int, _NONE), "suffix": (str, _NONE)},
    "chat": {**_COMMON, "messages": (list,), "logprobs": (bool, _NONE), "top_logprobs": (int, _NONE),
             "max_completion_tokens": (int, _NONE), "response_format": (dict, _NONE), "store": (bool, _NONE),
             "parallel_tool_calls": (bool, _NONE)},
}
_UNSUPPORTED = {"tools", "tool_choice", "functions", "function_call", "logit_bias", "audio", "modalities",
                "prediction", "web_search_options", "reasoning_effort", "service_tier"}
# Fields the gateway answers itself or that mean nothing to an engine.
_NOT_FORWARDED = {"model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "user", "metadata",
                  "store"}


@dataclass(slots=True)
class InferenceRequest:
    kind: str  # "completion" | "chat"
    body: dict  # the client's fields, checked
    model: str
    stream: bool
    include_usage: bool  # the client wants the final usage chunk
    continuous_usage: bool  # the client wants usage in every chunk
    max_tokens: int | None  # the completion budget the client asked for (None: the tenant's default)
    n: int
    prompts: list  # completion: each prompt (a string or token ids); chat: empty
    max_tokens_field: str = "max_tokens"  # the field max_tokens came from (chat: or max_completion_tokens)

    @property
    def num_choices(self) -> int:
        return max(1, len(self.prompts)) * self.n

    def tokenize_bodies(self) -> list[dict]:
        """One ``/tokenize`` body per prompt (ENGINE_PROTOCOL.md). Token-id prompts go too: the answer also
        carries the context length."""
        if self.kind == "chat":
            return [{"messages": self.body["messages"]}]
        return [{"prompt": p} for p in self.prompts]

    def engine_body(self, *, engine_model: str, max_tokens: int, adapter: dict | None, fairness_key: str,
                    cache_salt: str) -> dict:
        """What the engine gets: always a stream with cumulative usage in every chunk, whatever the client asked,
        so that a stream cut anywhere is metered exactly; the tenant's cache salt, so that its prompts share
        cached KV with its own requests only."""
        body = {name: value for name, value in self.body.items() if name not in _NOT_FORWARDED}
        body.update(model=engine_model, max_tokens=max_tokens, stream=True, fairness_key=fairness_key,
                    cache_salt=cache_salt,
                    stream_options={"include_usage": True, "continuous_usage_stats": True})
        if adapter is not None:
            body["adapter"] = adapter
        return body


def parse_request(kind: str, raw: bytes) -> InferenceRequest:
    try:
        body = json.loads(raw)
    except ValueError as exc:  # bad JSON or bad UTF-8; also an integer of more than 4300 digits
        raise bad_request(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("The body is not valid JSON: nested too deeply.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.", code="invalid_json")
    _check_fields(body, _SPECS[kind])
    required = "messages" if kind == "chat" else "prompt"
    for name in ("model", required):
        if name not in body:
            raise bad_request(f"Missing required parameter: '{name}'.", param=name, code="missing_required_parameter")
    stream = bool(body.get("stream"))
    include_usage, continuous = _stream_options(body, stream)
    # vLLM's reading for chat: max_completion_tokens when given (not null), else max_tokens
    budget_field = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = body.get(budget_field)
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"'{budget_field}' must be a positive integer.", param=budget_field)
    n = body.get("n") or 1
    prompts = _prompts(body["prompt"]) if kind == "completion" else []
    if kind == "chat" and not 0 < len(body["messages"]) <= MAX_MESSAGES:
        raise bad_request(f"'messages' must hold 1 to {MAX_MESSAGES} messages.", param="messages")
    _check_stops(body)
    if n < 1 or max(1, len(prompts)) * n > MAX_CHOICES:
        raise bad_request(f"'n' times the number of prompts must be between 1 and {MAX_CHOICES}.", param="n")
    return InferenceRequest(kind, body, body["model"], stream, include_usage, continuous, max_tokens, n, prompts,
                            budget_field)


def _check_fields(body: dict, spec: dict) -> None:
    for name, value in body.items():
        if name in _UNSUPPORTED:
            raise bad_request(f"'{name}' is not supported.", param=name, code="unsupported_parameter")
        types = spec.get(name)
        if types is None:
            raise bad_request(f"Unrecognized request argument supplied: '{excerpt(name)}'.", param=excerpt(name),
                              code="unknown_parameter")
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise bad_request(f"'{name}' has the wrong type ({type(value).__name__}).", param=name,
                              code="invalid_type")


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options") or {}
    if options and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    for name, value in options.items():
        if name not in ("include_usage", "continuous_usage_stats"):
            raise bad_request(f"Unrecognized argument 'stream_options.{excerpt(name)}'.", param="stream_options")
        if not isinstance(value, bool):
            raise bad_request(f"'stream_options.{name}' must be a boolean.", param="stream_options")
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def _check_stops(body: dict) -> None:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise bad_request(f"'stop' must be a string or a list of up to {MAX_STOPS} strings, each of 1 to "
                          f"{MAX_STOP_CHARS} characters.", param="stop")
    ids = body.get("stop_token_ids") or []
    if len(ids) > MAX_STOP_TOKEN_IDS or not _is_token_ids(ids, allow_empty=True):
        raise bad_request(f"'stop_token_ids' must be a list of up to {MAX_STOP_TOKEN_IDS} token ids "
                          f"(integers from 0 to {MAX_TOKEN_ID}).", param="stop_token_ids")


def _is_token_ids(value, *, allow_empty: bool = False) -> bool:
    return isinstance(value, list) and (allow_empty or bool(value)) and len(value) <= MAX_PROMPT_TOKEN_IDS and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value)


def _prompts(value) -> list:
    if isinstance(value, str):
        return [value]
    if _is_token_ids(value):
        return [value]
    if value and all(isinstance(p, str) for p in value):
        return list(value)
    if value and all(_is_token_ids(p) for p in value):
        return list(value)
    raise bad_request("'prompt' must be a string, a list of strings, token ids, or a list of token id lists "
                      f"(at most {MAX_PROMPT_TOKEN_IDS} ids each, each from 0 to {MAX_TOKEN_ID}).", param="prompt")
