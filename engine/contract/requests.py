"""A completion or chat request body, checked field by field into :class:`OpenAIRequest`.

The gateway parses what a client sent (``trusted=False``: the engine-only extensions are unknown fields there) and
the engine server parses what the gateway, a worker or an operator sent (``trusted=True``); both apply the same
checks, so a request either side accepts the other accepts too. Every refusal is a :class:`ContractError` naming
its field.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from engine.contract import fields as F
from engine.contract.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_JSON,
    INVALID_TYPE,
    MISSING_PARAMETER,
    UNKNOWN_PARAMETER,
    UNSUPPORTED_PARAMETER,
    ContractError,
    excerpt,
)
from engine.contract.tools import ToolRequest, parse_tools
from engine.fair_share import FairShare
from engine.structured.params import StructuredOutputsParams, StructuredOutputsParamsError


@dataclass(slots=True)
class AdapterSource:
    """The ``adapter`` extension: an opaque version id and where the engine may load it from."""

    id: str
    uri: str | None
    sha256: str | None


@dataclass(slots=True)
class OpenAIRequest:
    kind: str  # "completion" | "chat"
    body: dict = field(repr=False)  # the fields as sent, checked
    model: str
    stream: bool
    include_usage: bool  # the final usage chunk
    continuous_usage: bool  # usage in every chunk
    max_tokens: int | None  # the completion budget asked for (None: not given, or null)
    max_tokens_field: str  # the field it came from (chat: max_tokens or max_completion_tokens)
    n: int
    prompts: list  # completion: each prompt (text or token ids); chat: empty
    messages: list[dict] | None  # chat: each message as {"role", "content"} with text content
    prompt_token_ids: list[int] | None  # chat from the gateway: the messages already encoded
    logprobs: int | None  # completions' logprobs, or chat's top_logprobs when logprobs is true
    sampling: dict[str, Any]  # SamplingParams keyword arguments, max_tokens aside (structured_outputs included)
    adapter: AdapterSource | None = None
    cache_salt: str | None = None  # the prefix cache is shared only between requests with the same salt
    fairness_key: str | None = None
    tools: ToolRequest | None = None  # chat: the functions, and the tool_choice
    fairness_weight: float | None = None  # with fairness_key and priority: fair admission (engine.fairness)
    priority: str | None = None  # "interactive" (the default) or "batch"

    @property
    def num_choices(self) -> int:
        return max(1, len(self.prompts)) * self.n

    @property
    def prompt_field(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object."""
    try:
        body = json.loads(raw)
    except ValueError as exc:  # bad JSON or bad UTF-8; also an integer of more than 4300 digits
        raise ContractError(f"The body is not valid JSON: {exc}", code=INVALID_JSON) from None
    except RecursionError:
        raise ContractError("The body is not valid JSON: nested too deeply.", code=INVALID_JSON) from None
    if not isinstance(body, dict):
        raise ContractError("The body must be a JSON object.", code=INVALID_JSON)
    return body


def parse_request(kind: str, body: dict, *, trusted: bool = False) -> OpenAIRequest:
    """Check ``body`` (a completion's or a chat's) and read it; ``trusted`` admits the engine-only extensions."""
    spec = {**(F.CHAT if kind == "chat" else F.COMPLETION)}
    if trusted:
        spec.update(F.ENGINE_EXTENSIONS, **(F.CHAT_ENGINE_EXTENSIONS if kind == "chat" else {}))
    _check_fields(body, spec)
    prompts, messages, prompt_ids = _read_prompt(kind, body)
    stream = bool(body.get("stream"))
    include_usage, continuous = _stream_options(body, stream)
    budget_field = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None \
        else "max_tokens"  # vLLM's reading: max_completion_tokens when given (not null), else max_tokens
    max_tokens = body.get(budget_field)
    if max_tokens is not None and max_tokens < 1:
        raise ContractError(f"'{budget_field}' must be a positive integer.", param=budget_field)
    n = 1 if body.get("n") is None else body["n"]
    if n < 1 or max(1, len(prompts)) * n > F.MAX_CHOICES:
        raise ContractError(f"'n' times the number of prompts must be between 1 and {F.MAX_CHOICES}.", param="n")
    logprobs = _completion_options(body, n) if kind == "completion" else _chat_options(body)
    sampling = _sampling(body, logprobs)
    tools = parse_tools(body) if kind == "chat" else None
    constraint = _constraint(body, tools)
    if constraint is not None:
        sampling["structured_outputs"] = constraint
    return OpenAIRequest(
        kind, body, body["model"], stream, include_usage, continuous, max_tokens, budget_field, n, prompts, messages,
        prompt_ids, logprobs, sampling, parse_adapter(body.get("adapter")), _cache_salt(body),
        body.get("fairness_key"), tools, **_fairness(body))


def fit_completion(prompt_lengths: list[int], max_tokens: int | None, max_model_len: int, *,
                   prompt_field: str = "prompt", max_tokens_field: str = "max_tokens") -> int:
    """The completion budget that fits the context after the longest prompt: ``max_tokens`` when it fits (413
    otherwise), or all the room left when it is None. The one length check of a request, wherever it runs."""
    longest = max(prompt_lengths)
    room = max_model_len - longest
    budget = room if max_tokens is None else max_tokens
    if room < 1 or budget > room:
        wanted = longest + max(budget, 1)
        raise ContractError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {wanted} tokens "
            f"({longest} in the prompt, {max(budget, 1)} for the completion). Please reduce the prompt or the "
            "completion length.", param=prompt_field if room < 1 else max_tokens_field,
            code=CONTEXT_LENGTH_EXCEEDED, status=413)
    return budget


def _check_fields(body: dict, spec: dict) -> None:
    for name, value in body.items():
        if name in F.UNSUPPORTED:
            raise ContractError(f"'{name}' is not supported.", param=name, code=UNSUPPORTED_PARAMETER)
        types = spec.get(name)
        if types is None:
            raise ContractError(f"Unrecognized request argument supplied: '{excerpt(name)}'.", param=excerpt(name),
                                code=UNKNOWN_PARAMETER)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise ContractError(f"'{name}' has the wrong type ({type(value).__name__}).", param=name,
                                code=INVALID_TYPE)
    if "model" not in body:
        raise ContractError("Missing required parameter: 'model'.", param="model", code=MISSING_PARAMETER)


def _read_prompt(kind: str, body: dict) -> tuple[list, list[dict] | None, list[int] | None]:
    if kind == "completion":
        if "prompt" not in body:
            raise ContractError("Missing required parameter: 'prompt'.", param="prompt", code=MISSING_PARAMETER)
        return _prompts(body["prompt"]), None, None
    if "prompt_token_ids" in body:  # the gateway's: the messages encoded by /tokenize
        if "messages" in body or not _is_token_ids(body["prompt_token_ids"]):
            raise ContractError("'prompt_token_ids' must be token ids, sent instead of 'messages'.",
                                param="prompt_token_ids")
        return [], None, body["prompt_token_ids"]
    if "messages" not in body:
        raise ContractError("Missing required parameter: 'messages'.", param="messages", code=MISSING_PARAMETER)
    return [], _messages(body["messages"]), None


def _text(value: str, param: str) -> str:
    """``value`` if it is text that can be encoded: JSON's ``\\ud800`` escapes decode to lone surrogates, which no
    tokenizer takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ContractError(f"'{param}' is not valid Unicode text (it holds a lone surrogate).", param=param) from None
    return value


def _is_token_ids(value, *, allow_empty: bool = False) -> bool:
    return isinstance(value, list) and (allow_empty or bool(value)) and len(value) <= F.MAX_PROMPT_TOKEN_IDS and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= F.MAX_TOKEN_ID for t in value)


def _prompts(value) -> list:
    if isinstance(value, str):
        return [_text(value, "prompt")]
    if _is_token_ids(value):
        return [value]
    if value and all(isinstance(p, str) for p in value):
        return [_text(p, "prompt") for p in value]
    if value and all(_is_token_ids(p) for p in value):
        return list(value)
    raise ContractError("'prompt' must be a string, a list of strings, token ids, or a list of token id lists "
                        f"(at most {F.MAX_PROMPT_TOKEN_IDS} ids each, each from 0 to {F.MAX_TOKEN_ID}).",
                        param="prompt")


def _messages(value: list) -> list[dict]:
    """Each message as ``{"role", "content"}`` with text content (``developer`` is a system message)."""
    if not 0 < len(value) <= F.MAX_MESSAGES:
        raise ContractError(f"'messages' must hold 1 to {F.MAX_MESSAGES} messages.", param="messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in F.MESSAGE_ROLES:
            raise ContractError(f"messages[{i}] needs a role of system, developer, user, assistant or tool.",
                                param=f"messages[{i}].role")
        content = message.get("content")
        if isinstance(content, list):  # the array form: only text parts
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ContractError(f"messages[{i}].content: only text parts are supported.",
                                    param=f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if calls is not None:
            content = _tool_calls_text(calls, content, i)
        if not isinstance(content, str):
            raise ContractError(f"messages[{i}].content must be a string.", param=f"messages[{i}].content")
        role = "system" if message["role"] == "developer" else message["role"]
        normalized = {"role": role, "content": _text(content, f"messages[{i}].content")}
        if calls is not None:
            normalized["tool_calls"] = calls
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            normalized["tool_call_id"] = message["tool_call_id"]
        messages.append(normalized)
    return messages


def _tool_calls_text(calls, content, i: int) -> str:
    """An assistant turn's calls as text (what a chat template without a tool format shows), after its content."""
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
            and isinstance(c["function"].get("arguments", ""), str) for c in calls):
        raise ContractError(f"messages[{i}].tool_calls must be a list of function calls.",
                            param=f"messages[{i}].tool_calls")
    text = json.dumps([{"name": c["function"]["name"], "arguments": c["function"].get("arguments", "")}
                       for c in calls], ensure_ascii=False)
    return f"{content}\n{text}" if isinstance(content, str) and content else text


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options") or {}
    if options and not stream:
        raise ContractError("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    for name, value in options.items():
        if name not in ("include_usage", "continuous_usage_stats"):
            raise ContractError(f"Unrecognized argument 'stream_options.{excerpt(name)}'.", param="stream_options",
                                code=UNKNOWN_PARAMETER)
        if not isinstance(value, bool):
            raise ContractError(f"'stream_options.{name}' must be a boolean.", param=f"stream_options.{name}")
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def _completion_options(body: dict, n: int) -> int | None:
    """The completions' logprobs; echo, suffix and best_of other than n are refused."""
    for name in ("echo", "suffix"):
        if body.get(name):
            raise ContractError(f"'{name}' is not supported.", param=name, code=UNSUPPORTED_PARAMETER)
    best_of = body.get("best_of")
    if best_of is not None and best_of < n:
        raise ContractError(f"'best_of' ({best_of}) must be at least 'n' ({n}).", param="best_of")
    if best_of is not None and best_of != n:
        raise ContractError("'best_of' other than n is not supported.", param="best_of", code=UNSUPPORTED_PARAMETER)
    logprobs = body.get("logprobs")
    if logprobs is not None and not 0 <= logprobs <= F.MAX_LOGPROBS:
        raise ContractError(f"'logprobs' must be between 0 and {F.MAX_LOGPROBS}.", param="logprobs")
    return logprobs


def _chat_options(body: dict) -> int | None:
    """Chat's top_logprobs (None without logprobs)."""
    top = body.get("top_logprobs")
    if top is not None and (not body.get("logprobs") or not 0 <= top <= F.MAX_LOGPROBS):
        raise ContractError(f"'top_logprobs' needs 'logprobs': true and 0..{F.MAX_LOGPROBS}.", param="top_logprobs")
    return (top or 0) if body.get("logprobs") else None


def _sampling(body: dict, logprobs: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"logprobs": logprobs, "stop": _stops(body.get("stop"))}
    for name in F.SAMPLING:
        params[name] = body.get(name)
    ids = params["stop_token_ids"]
    if ids is not None and (len(ids) > F.MAX_STOP_TOKEN_IDS or not _is_token_ids(ids, allow_empty=True)):
        raise ContractError(f"'stop_token_ids' must be a list of up to {F.MAX_STOP_TOKEN_IDS} token ids "
                            f"(integers from 0 to {F.MAX_TOKEN_ID}).", param="stop_token_ids")
    return {name: value for name, value in params.items() if value is not None}


def _stops(value) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if len(stops) > F.MAX_STOPS or not all(isinstance(s, str) and 0 < len(s) <= F.MAX_STOP_CHARS for s in stops):
        raise ContractError(f"'stop' must be a string or a list of up to {F.MAX_STOPS} strings, each of 1 to "
                            f"{F.MAX_STOP_CHARS} characters.", param="stop")
    return [_text(s, "stop") for s in stops]


def parse_adapter(value: dict | None) -> AdapterSource | None:
    """The ``adapter`` extension (``{"id", "uri"?, "sha256"?}``), checked."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ContractError("'adapter' must be an object with 'id', 'uri' and 'sha256'.", param="adapter")
    unknown = set(value) - {"id", "uri", "sha256"}
    if unknown:
        raise ContractError(f"Unrecognized argument 'adapter.{excerpt(sorted(unknown)[0])}'.", param="adapter",
                            code=UNKNOWN_PARAMETER)
    if not isinstance(value.get("id"), str) or not value["id"]:
        raise ContractError("'adapter.id' must be a non-empty string.", param="adapter.id")
    for key in ("uri", "sha256"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise ContractError(f"'adapter.{key}' must be a string.", param=f"adapter.{key}")
    return AdapterSource(value["id"], value.get("uri"), value.get("sha256"))



def _fairness(body: dict) -> dict:
    """``fairness_weight`` and ``priority``, checked as the engine checks them (``fairness_key`` too)."""
    key, weight, priority = body.get("fairness_key"), body.get("fairness_weight"), body.get("priority")
    try:
        FairShare.of(key, weight, priority)
    except ValueError as exc:
        field = next(name for name in ("fairness_key", "fairness_weight", "priority") if name in str(exc))
        raise ContractError(f"'{field}'{str(exc).removeprefix(field)}.", param=field) from None
    return {"fairness_weight": weight, "priority": priority}


def _cache_salt(body: dict) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and not 0 < len(salt) <= F.MAX_CACHE_SALT_CHARS:
        raise ContractError(f"'cache_salt' must be 1 to {F.MAX_CACHE_SALT_CHARS} characters.", param="cache_salt")
    return None if salt is None else _text(salt, "cache_salt")


def _constraint(body: dict, tools: ToolRequest | None) -> StructuredOutputsParams | None:
    """The output constraint of ``response_format`` (chat: json_object, json_schema), of vLLM's
    ``structured_outputs`` (both endpoints) or of a forced tool choice, checked for shape and size; the engine
    compiles it."""
    fmt, extension = body.get("response_format"), body.get("structured_outputs")
    fields = _response_format(fmt) if fmt is not None else None
    param = "response_format"
    if extension is not None:
        if fields is not None:
            raise ContractError("Give 'response_format' or 'structured_outputs', not both.", param="structured_outputs")
        fields, param = dict(extension), "structured_outputs"
    if tools is not None and tools.forced:
        if fields is not None:
            raise ContractError(f"A forced 'tool_choice' constrains the output already; drop '{param}'.",
                                param="tool_choice")
        # compact JSON: the arguments are re-serialized anyway, and small models loop on free whitespace
        fields, param = {"json": tools.constraint_schema(), "disable_any_whitespace": True}, "tools"
    if fields is None:
        return None
    _check_constraint_size(fields, param)
    try:
        return StructuredOutputsParams(**fields)
    except TypeError:
        unknown = sorted(set(fields) - set(StructuredOutputsParams.__dataclass_fields__) - {"_schema"})
        raise ContractError(f"Unrecognized argument '{param}.{excerpt(unknown[0] if unknown else '?')}'.",
                            param=param, code=UNKNOWN_PARAMETER) from None
    except StructuredOutputsParamsError as exc:
        raise ContractError(f"{exc}.", param=param if param == "response_format" else exc.param) from None


def _response_format(fmt: dict) -> dict | None:
    """OpenAI's response_format as structured_outputs fields (None for plain text)."""
    kind = fmt.get("type")
    if kind == "text" and set(fmt) == {"type"}:
        return None
    if kind == "json_object" and set(fmt) == {"type"}:
        return {"json_object": True}
    if kind == "json_schema" and set(fmt) == {"type", "json_schema"} and isinstance(fmt["json_schema"], dict):
        spec = fmt["json_schema"]
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise ContractError(f"Unrecognized argument 'response_format.json_schema.{excerpt(sorted(unknown)[0])}'.",
                                param="response_format", code=UNKNOWN_PARAMETER)
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ContractError("'response_format.json_schema.name' must be a non-empty string.",
                                param="response_format")
        if not isinstance(spec.get("schema"), dict):
            raise ContractError("'response_format.json_schema.schema' must be a JSON Schema object.",
                                param="response_format")
        return {"json": spec["schema"]}
    raise ContractError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                        "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\", \"strict\"}}.",
                        param="response_format")


def _check_constraint_size(fields: dict, param: str) -> None:
    text = json.dumps(fields, ensure_ascii=False)
    if len(text) > F.MAX_CONSTRAINT_CHARS:
        raise ContractError(f"'{param}' is {len(text)} characters; the limit is {F.MAX_CONSTRAINT_CHARS}.",
                            param=param)
    if _depth(fields) > F.MAX_SCHEMA_DEPTH:
        raise ContractError(f"'{param}' nests deeper than {F.MAX_SCHEMA_DEPTH} levels.", param=param)


def _depth(value, level: int = 0) -> int:
    if level > F.MAX_SCHEMA_DEPTH:  # deep enough to refuse: no need to walk further
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((_depth(child, level + 1) for child in children), default=level)
