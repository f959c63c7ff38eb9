"""Parsing of OpenAI completion and chat requests into what the engine runs, with 400s that name the field.

OpenAI fields that would change the answer but that the engine does not implement (tools, response_format,
logit_bias, ...) are refused by name, never silently ignored; fields that change nothing here (``user``,
``metadata``) are accepted. Anything else unknown is refused too, so a typo never passes unnoticed.
"""

from dataclasses import dataclass, field
from typing import Any

from engine.server.errors import bad_request, excerpt

# Fields both endpoints accept, with the type check each value must pass.
_COMMON = {
    "model": str, "max_tokens": (int, type(None)), "temperature": (int, float, type(None)),
    "top_p": (int, float, type(None)), "n": (int, type(None)), "stream": (bool, type(None)),
    "stream_options": (dict, type(None)), "stop": (str, list, type(None)), "seed": (int, type(None)),
    "presence_penalty": (int, float, type(None)), "frequency_penalty": (int, float, type(None)),
    "user": (str, type(None)), "metadata": (dict, type(None)),
    # extensions (ENGINE_PROTOCOL.md)
    "ignore_eos": bool, "min_tokens": int, "top_k": int, "min_p": (int, float),
    "repetition_penalty": (int, float), "stop_token_ids": (list, type(None)), "adapter": (dict, type(None)),
    "fairness_key": (str, type(None)), "cache_salt": (str, type(None)),
}
_COMPLETION = {**_COMMON, "prompt": (str, list), "logprobs": (int, type(None)), "echo": (bool, type(None)),
               "best_of": (int, type(None)), "suffix": (str, type(None))}
_CHAT = {**_COMMON, "messages": list, "logprobs": (bool, type(None)), "top_logprobs": (int, type(None)),
         "max_completion_tokens": (int, type(None)), "response_format": (dict, type(None)),
         "store": (bool, type(None)), "parallel_tool_calls": (bool, type(None))}
_UNSUPPORTED = {"tools", "tool_choice", "functions", "function_call", "logit_bias", "audio", "modalities",
                "prediction", "web_search_options", "reasoning_effort", "service_tier"}
MAX_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 256
MAX_CACHE_SALT_CHARS = 256


@dataclass(slots=True)
class AdapterSource:
    id: str
    uri: str | None
    sha256: str | None


@dataclass(slots=True)
class GenerationRequest:
    """What one completion or chat request asks the engine for."""

    kind: str  # "completion" | "chat"
    model: str
    prompts: list[str | list[int]]  # completion: one per prompt; chat: empty (messages instead)
    messages: list[dict] | None
    params: dict[str, Any]  # SamplingParams keyword arguments
    stream: bool
    include_usage: bool
    continuous_usage: bool
    adapter: AdapterSource | None
    logprobs: int | None
    raw: dict = field(repr=False, default_factory=dict)
    cache_salt: str | None = None  # the prefix cache is shared only between requests with the same salt


def _check_fields(body: dict, spec: dict) -> None:
    for name, value in body.items():
        if name in _UNSUPPORTED:
            raise bad_request(f"'{name}' is not supported by this server", param=name, code="unsupported_field")
        if name not in spec:
            raise bad_request(f"unknown field '{excerpt(name)}'", param=excerpt(name), code="unknown_field")
        expected = spec[name]
        if isinstance(value, bool) and expected in (int, float) or (
            isinstance(value, bool) and isinstance(expected, tuple) and bool not in expected
        ):
            raise bad_request(f"'{name}' must not be a boolean", param=name)
        if not isinstance(value, expected):
            raise bad_request(f"'{name}' has the wrong type ({type(value).__name__})", param=name)


def _text(value: str, param: str) -> str:
    """``value`` if it is text that can be encoded: JSON's ``\\ud800`` escapes decode to lone surrogates, which no
    tokenizer takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"'{param}' is not valid Unicode text (it holds a lone surrogate)", param=param) from None
    return value


def _stop(value) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise bad_request("'stop' must be a non-empty string or a list of up to 16 of them", param="stop")
    return [_text(s, "stop") for s in stops]


def parse_adapter(value: dict | None) -> AdapterSource | None:
    """The ``adapter`` extension field (``{"id", "uri"?, "sha256"?}``), checked."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("'adapter' must be an object with 'id', 'uri' and 'sha256'", param="adapter")
    unknown = set(value) - {"id", "uri", "sha256"}
    if unknown:
        raise bad_request(f"unknown field 'adapter.{excerpt(sorted(unknown)[0])}'", param="adapter")
    if not isinstance(value.get("id"), str) or not value["id"]:
        raise bad_request("'adapter.id' must be a non-empty string", param="adapter.id")
    for key in ("uri", "sha256"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise bad_request(f"'adapter.{key}' must be a string", param=f"adapter.{key}")
    return AdapterSource(value["id"], value.get("uri"), value.get("sha256"))


def _sampling(body: dict, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": max_tokens, "logprobs": logprobs, "stop": _stop(body.get("stop"))}
    for name in ("temperature", "top_p", "n", "seed", "presence_penalty", "frequency_penalty", "ignore_eos",
                 "min_tokens", "top_k", "min_p", "repetition_penalty", "stop_token_ids"):
        if body.get(name) is not None:
            params[name] = body[name]
    if "stop_token_ids" in params and (len(params["stop_token_ids"]) > MAX_STOP_TOKEN_IDS or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in params["stop_token_ids"])):
        raise bad_request(f"'stop_token_ids' must be a list of at most {MAX_STOP_TOKEN_IDS} integers",
                          param="stop_token_ids")
    if params.get("n", 1) > 16:
        raise bad_request("'n' must be at most 16", param="n")
    return {k: v for k, v in params.items() if v is not None}


def _stream_options(body: dict) -> tuple[bool, bool]:
    options = body.get("stream_options") or {}
    if options and not body.get("stream"):
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    unknown = set(options) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        raise bad_request(f"unknown field 'stream_options.{excerpt(sorted(unknown)[0])}'", param="stream_options")
    for name, value in options.items():
        if not isinstance(value, bool):
            raise bad_request(f"'stream_options.{name}' must be a boolean", param=f"stream_options.{name}")
    return options.get("include_usage", False), options.get("continuous_usage_stats", False)


def _cache_salt(body: dict) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
        raise bad_request(f"'cache_salt' must be 1 to {MAX_CACHE_SALT_CHARS} characters", param="cache_salt")
    return None if salt is None else _text(salt, "cache_salt")


def _prompts(value) -> list[str | list[int]]:
    if isinstance(value, str):
        return [_text(value, "prompt")]
    if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return [value]
    if value and all(isinstance(p, str) for p in value):
        return [_text(p, "prompt") for p in value]
    if value and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in value):
        return list(value)
    raise bad_request("'prompt' must be a string, a list of strings, or token ids", param="prompt")


def parse_completion(body: dict) -> GenerationRequest:
    _check_fields(body, _COMPLETION)
    if "model" not in body or "prompt" not in body:
        raise bad_request("'model' and 'prompt' are required", param="prompt" if "model" in body else "model")
    if body.get("echo"):
        raise bad_request("'echo' is not supported by this server", param="echo", code="unsupported_field")
    if body.get("suffix"):
        raise bad_request("'suffix' is not supported by this server", param="suffix", code="unsupported_field")
    best_of, n = body.get("best_of"), body.get("n") or 1
    if best_of is not None and best_of < n:
        raise bad_request(f"'best_of' ({best_of}) must be at least 'n' ({n})", param="best_of")
    if best_of is not None and best_of != n:
        raise bad_request("'best_of' other than n is not supported", param="best_of", code="unsupported_field")
    logprobs = body.get("logprobs")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    include_usage, continuous = _stream_options(body)
    return GenerationRequest(
        "completion", body["model"], _prompts(body["prompt"]), None,
        _sampling(body, body.get("max_tokens", 16), logprobs), bool(body.get("stream")), include_usage, continuous,
        parse_adapter(body.get("adapter")), logprobs, body, _cache_salt(body),
    )


def _messages(value: list) -> list[dict]:
    if not value:
        raise bad_request("'messages' must not be empty", param="messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in {"system", "user", "assistant", "developer"}:
            raise bad_request(f"messages[{i}] needs a role of system, user, assistant", param=f"messages[{i}].role")
        content = message.get("content")
        if isinstance(content, list):  # the array form: only text parts
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"messages[{i}].content: only text parts are supported",
                                  param=f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        _text(content, f"messages[{i}].content")
        value[i] = {"role": "system" if message["role"] == "developer" else message["role"], "content": content}
    return value


def parse_chat(body: dict) -> GenerationRequest:
    _check_fields(body, _CHAT)
    if "model" not in body or "messages" not in body:
        raise bad_request("'model' and 'messages' are required", param="messages" if "model" in body else "model")
    fmt = body.get("response_format")
    if fmt is not None and fmt.get("type") != "text":
        raise bad_request("'response_format' other than text is not supported", param="response_format",
                          code="unsupported_field")
    top = body.get("top_logprobs")
    if top is not None and (not body.get("logprobs") or not 0 <= top <= MAX_LOGPROBS):
        raise bad_request(f"'top_logprobs' needs 'logprobs': true and 0..{MAX_LOGPROBS}", param="top_logprobs")
    logprobs = (top or 0) if body.get("logprobs") else None
    # vLLM's reading: max_completion_tokens when given (not null), else max_tokens
    max_tokens = body["max_completion_tokens"] if body.get("max_completion_tokens") is not None \
        else body.get("max_tokens")
    include_usage, continuous = _stream_options(body)
    return GenerationRequest(
        "chat", body["model"], [], _messages(body["messages"]), _sampling(body, max_tokens, logprobs),
        bool(body.get("stream")), include_usage, continuous, parse_adapter(body.get("adapter")), logprobs, body,
        _cache_salt(body),
    )
