"""A client's completion or chat request, checked by the contract (engine.contract) before anything is counted
or reserved, and the body sent to an engine.

Clients cannot send the engine-only extensions (``adapter``, ``fairness_key``, ``fairness_weight``, ``priority``,
``cache_salt``): the gateway sets those. The prompt goes to the engine as the token ids ``/tokenize`` gave, so it
is encoded once.
"""

from engine.contract import ContractError, OpenAIRequest, parse_json
from engine.contract import parse_request as parse_contract
from gateway.errors import GatewayError

# Fields the gateway answers itself or that mean nothing to an engine.
_NOT_FORWARDED = {"model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "user", "metadata",
                  "store", "prompt", "messages"}


def contract_error(exc: ContractError) -> GatewayError:
    """The contract's refusal as the client's 400 (OpenAI answers an over-long request with 400, not 413)."""
    return GatewayError(400, exc.message, code=exc.code, param=exc.param)


def parse_request(kind: str, raw: bytes) -> OpenAIRequest:
    return check_request(kind, read_body(raw))


def read_body(raw: bytes) -> dict:
    """The body as a JSON object (a 400 otherwise), before the contract's checks."""
    try:
        return parse_json(raw)
    except ContractError as exc:
        raise contract_error(exc) from None


def check_request(kind: str, body: dict) -> OpenAIRequest:
    try:
        return parse_contract(kind, body)
    except ContractError as exc:
        raise contract_error(exc) from None


def tokenize_bodies(parsed: OpenAIRequest) -> list[dict]:
    """One ``/tokenize`` body per prompt (ENGINE_PROTOCOL.md). Token-id prompts go too: the answer also carries
    the context length."""
    if parsed.kind == "chat":  # the tools are part of the prompt where the chat template renders them
        tools = {name: parsed.body[name] for name in ("tools", "tool_choice", "parallel_tool_calls")
                 if parsed.body.get(name) is not None}
        return [{"messages": parsed.messages, **tools}]
    return [{"prompt": p} for p in parsed.prompts]


def engine_body(parsed: OpenAIRequest, prompt_ids: list[list[int]], *, engine_model: str, max_tokens: int,
                adapter: dict | None, fairness_key: str, fairness_weight: int, priority: str,
                cache_salt: str) -> dict:
    """What the engine gets: the prompt as the token ids /tokenize gave; always a stream with cumulative usage in
    every chunk, whatever the client asked, so that a stream cut anywhere is metered exactly; the tenant's fair
    share (its key, its plan's weight, the class of the request); the tenant's cache salt, so that its prompts
    share cached KV with its own requests only."""
    body = {name: value for name, value in parsed.body.items() if name not in _NOT_FORWARDED}
    if parsed.kind == "chat":
        body["prompt_token_ids"] = prompt_ids[0]
    else:
        body["prompt"] = prompt_ids[0] if len(prompt_ids) == 1 else prompt_ids
    body.update(model=engine_model, max_tokens=max_tokens, stream=True, fairness_key=fairness_key,
                fairness_weight=fairness_weight, priority=priority, cache_salt=cache_salt,
                stream_options={"include_usage": True, "continuous_usage_stats": True})
    if adapter is not None:
        body["adapter"] = adapter
    return body
