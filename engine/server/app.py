"""The engine's HTTP API (ENGINE_PROTOCOL.md): OpenAI completions and chat with SSE, models, tokenize, warm
compiles of output constraints, adapter admin, health, stats and Prometheus metrics. Internal: a bearer key guards
all but ``/health``."""

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.async_engine import AsyncEngine, EngineDead, EngineOverloaded, StepFailed
from engine.contract import ContractError, OpenAIRequest, excerpt, parse_json, parse_request
from engine.lora.errors import AdapterError
from engine.server.errors import APIError, bad_request, contract_error
from engine.server.generation import RequestState, full_response, stream_events
from engine.server.metrics import EngineMetrics
from engine.server.serving_model import ServingModel, adapter_error

logger = logging.getLogger("engine.server")
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class ServerState:
    engine: AsyncEngine
    served_model: str
    api_key: str | None
    model: ServingModel
    metrics: EngineMetrics
    started_at: float


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def _json_body(request: Request) -> dict:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes", code="body_too_large")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"request body over {MAX_BODY_BYTES} bytes", code="body_too_large")
    return _contract(parse_json, raw)


def _contract(parse, *args, **kwargs):
    """``parse(*args, **kwargs)`` with the contract's refusals as API errors."""
    try:
        return parse(*args, **kwargs)
    except ContractError as exc:
        raise contract_error(exc) from None


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and given.isprintable():
        return given
    prefix = _ID_PREFIXES.get(request.url.path, "req")  # OpenAI's: the response id is the request id
    return f"{prefix}-{uuid.uuid4().hex}"


_ID_PREFIXES = {"/v1/completions": "cmpl", "/v1/chat/completions": "chatcmpl"}


class AuthAndErrors:
    """ASGI middleware: bearer key on every path but /health, request ids echoed, errors in OpenAI shape."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        request_id = _request_id(request)
        scope.setdefault("state", {})["request_id"] = request_id
        key = scope["app"].state.server.api_key
        if key and scope["path"] != "/health":
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return await APIError(401, "missing or wrong bearer key", code="invalid_api_key").response(
                    request_id)(scope, receive, send)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except APIError as exc:
            await exc.response(request_id)(scope, receive, send)
        except Exception:
            logger.exception("request %s failed", request_id)
            error = APIError(500, "internal error; the engine logged the details", code="internal_error")
            await error.response(request_id)(scope, receive, send)


async def health(request: Request) -> Response:
    state = _state(request)
    if state.engine.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def stats(request: Request) -> Response:
    return JSONResponse(await _stats(_state(request)))


async def _stats(state: ServerState) -> dict:
    body = await state.engine.call(lambda engine: engine.stats())
    body["model"] = state.served_model
    body["uptime_s"] = round(time.time() - state.started_at, 1)
    body["saturated"] = state.engine.saturated()
    body["structured_outputs"] = state.engine.structured_outputs_stats()
    body.setdefault("adapters", {"slots": 0, "resident": [], "host_tier": [], "hits": 0, "misses": 0,
                                 "evictions": 0, "load_ms_p50": 0.0})
    return body


async def metrics(request: Request) -> Response:
    state = _state(request)
    state.metrics.update_from_stats(await _stats(state))
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


async def models(request: Request) -> Response:
    state = _state(request)
    created = int(state.started_at)
    data = [{"id": state.served_model, "object": "model", "created": created, "owned_by": "engine", "root": None}]
    for adapter in await state.model.adapters():
        data.append({"id": str(adapter["id"]), "object": "model", "created": created, "owned_by": "engine",
                     "root": state.served_model, "parent": state.served_model,
                     "rank": adapter["rank"], "slot": adapter["slot"]})
    return JSONResponse({"object": "list", "data": data})


_TOKENIZE_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # chat: the template renders the tools


async def tokenize(request: Request) -> Response:
    """A prompt's (or a conversation's, chat template applied) token ids, so the gateway can count them exactly and
    send the ids themselves as the prompt."""
    state = _state(request)
    body = await _json_body(request)
    unknown = set(body) - {"prompt", "messages", "adapter", "model", *_TOKENIZE_TOOL_FIELDS}
    if unknown:
        name = excerpt(sorted(unknown)[0])
        raise bad_request(f"unknown field '{name}'", param=name, code="unknown_parameter")
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give exactly one of 'prompt' or 'messages'", param="prompt")
    kind = "chat" if "messages" in body else "completion"
    fields = {"model": body.get("model", state.served_model),
              **{k: body[k] for k in ("prompt", "messages", *_TOKENIZE_TOOL_FIELDS) if k in body}}
    if kind == "completion" and any(k in body for k in _TOKENIZE_TOOL_FIELDS):
        raise bad_request("'tools' go with 'messages' only", param="tools")
    parsed = _contract(parse_request, kind, fields)
    if len(parsed.prompts) > 1:
        raise bad_request("'prompt' must be a single prompt here", param="prompt")
    token_ids = state.model.prompt_token_ids(parsed)[0]
    return JSONResponse({"count": len(token_ids), "max_model_len": state.model.max_model_len, "tokens": token_ids})


async def compile_structured_outputs(request: Request) -> Response:
    """Compile an output constraint into the grammar cache ahead of the requests that use it (the control plane
    calls this when a tenant registers a schema): a later request with the same constraint and ``cache_salt``
    pays no compile. Body ``{"structured_outputs": {...}, "cache_salt"?}``, checked by the request contract itself
    (as the fields of a completion), so a constraint is refused here exactly when a request would be."""
    state = _state(request)
    body = await _json_body(request)
    unknown = set(body) - {"structured_outputs", "cache_salt"}
    if unknown:
        name = excerpt(sorted(unknown)[0])
        raise bad_request(f"unknown field '{name}'", param=name, code="unknown_parameter")
    parsed = _contract(parse_request, "completion", {"model": state.served_model, "prompt": [0], **body},
                       trusted=True)
    params = parsed.sampling.get("structured_outputs")
    if params is None:
        raise bad_request("'structured_outputs' (json, regex, choice, grammar or json_object) is required",
                          param="structured_outputs", code="missing_required_parameter")
    try:
        result = await state.engine.compile_constraint(params, parsed.cache_salt)
    except ValueError as exc:  # GrammarCompileError, GrammarCompileTimeout: they name the field
        raise _as_api_error(exc) from None
    return JSONResponse({"object": "structured_outputs.compiled", "kind": params.kind, "cached": result.cached,
                         "compile_ms": round(result.compile_ms, 3)})


async def completions(request: Request) -> Response:
    return await _generate(request, _contract(parse_request, "completion", await _json_body(request), trusted=True))


async def chat_completions(request: Request) -> Response:
    return await _generate(request, _contract(parse_request, "chat", await _json_body(request), trusted=True))


async def _generate(request: Request, parsed: OpenAIRequest) -> Response:
    state = _state(request)
    request_id = request.scope["state"]["request_id"]
    lora_request = await state.model.resolve(parsed.model, parsed.adapter)
    prompt_ids = state.model.prompt_token_ids(parsed)
    params = state.model.sampling_params(parsed, prompt_ids)
    run = RequestState(parsed, request_id, int(time.time()), prompt_tokens=sum(len(p) for p in prompt_ids))
    outputs = _merged_outputs(state, request_id, prompt_ids, params, lora_request, parsed.cache_salt,
                              {"fairness_key": parsed.fairness_key, "fairness_weight": parsed.fairness_weight,
                               "priority": parsed.priority})
    if parsed.stream:
        first = await _first_or_error(outputs)
        events = stream_events(run, _prepend(first, outputs), state.model.tokenizer,
                               on_first_token=lambda: None)
        return StreamingResponse(_observed(state, run, events), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    finals: dict[int, object] = {}
    n = params[0].n if params else 1
    try:
        async for prompt_index, completion in outputs:
            finals[prompt_index * n + completion.index] = completion
            if run.first_token_at is None and completion.token_ids:
                run.first_token_at = time.monotonic()
    finally:
        _observe(state, run, outcome="finished")
    return JSONResponse(full_response(run, finals, state.model.tokenizer))


async def _merged_outputs(state: ServerState, request_id: str, prompt_ids: list[list[int]], params, lora_request,
                          cache_salt: str | None, fairness: dict):
    """One engine request per prompt (``id``, ``id<US>1``, ...), their outputs merged as (prompt index, completion).
    The separator is the non-printable unit separator, which no request id taken from a client holds, so another
    request's ``X-Request-Id`` can never name one of these."""
    if len(prompt_ids) == 1:
        async for item in _single_outputs(state, request_id, prompt_ids[0], params[0], lora_request, cache_salt,
                                          fairness):
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    sub_ids = [request_id if i == 0 else f"{request_id}\x1f{i}" for i in range(len(prompt_ids))]

    async def pump(index: int, sub_id: str) -> None:
        try:
            async for output in state.engine.generate(sub_id, None, params[index], prompt_token_ids=prompt_ids[index],
                                                      lora_request=lora_request, cache_salt=cache_salt,
                                                      **fairness):
                if output.error is not None:  # before any completion: a stream not yet started gets the status
                    await queue.put(output.error)
                    break
                for completion in output.outputs:
                    await queue.put((index, completion))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, sub_id)) for i, sub_id in enumerate(sub_ids)]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise _as_api_error(item)
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def _single_outputs(state: ServerState, request_id: str, prompt_ids: list[int], params, lora_request,
                          cache_salt: str | None, fairness: dict):
    """What :func:`_merged_outputs` gives for one prompt, read straight from the engine's stream: no pump task and
    no second queue, which cost every streamed token two more hand-offs on the event loop."""
    outputs = state.engine.generate(request_id, None, params, prompt_token_ids=prompt_ids, lora_request=lora_request,
                                    cache_salt=cache_salt, **fairness)
    try:
        async for output in outputs:
            if output.error is not None:  # before any completion: a stream not yet started gets the status
                raise _as_api_error(output.error)
            for completion in output.outputs:
                yield 0, completion
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine's refusals as API errors, as the merged path gives them
        raise _as_api_error(exc) from None
    finally:
        await outputs.aclose()  # an abandoned stream aborts its request now, not when the generator is collected


def _as_api_error(exc: BaseException) -> BaseException:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, AdapterError):
        return adapter_error(exc)
    if isinstance(exc, EngineOverloaded):
        return APIError(503, str(exc), code="overloaded", retry_after=1)
    if isinstance(exc, EngineDead):
        return APIError(503, str(exc), code="engine_dead", retry_after=5)
    if isinstance(exc, StepFailed):
        return APIError(500, str(exc), code="engine_step_failed")
    if isinstance(exc, ValueError):
        return bad_request(str(exc), param=getattr(exc, "param", None))
    return exc


async def _first_or_error(outputs):
    """Wait for the first output so that errors before any token become a proper HTTP status, not a stream."""
    try:
        return await anext(outputs)
    except StopAsyncIteration:
        return None


async def _prepend(first, rest):
    if first is not None:
        yield first
    async for item in rest:
        yield item


async def _observed(state: ServerState, run: RequestState, events):
    outcome = "aborted"
    try:
        async for event in events:
            yield event
        outcome = "finished"
    except APIError as exc:
        outcome = "error"
        yield f"data: {json.dumps(exc.body())}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        _observe(state, run, outcome=outcome)


def _observe(state: ServerState, run: RequestState, *, outcome: str) -> None:
    now = time.monotonic()
    ttft = None if run.first_token_at is None else run.first_token_at - run.arrived_at
    state.metrics.observe_request(outcome=outcome, ttft=ttft, e2e=now - run.arrived_at,
                                  num_generated=run.completion_tokens)
    state.metrics.prompt_tokens.inc(run.prompt_tokens)
    state.metrics.generated_tokens.inc(run.completion_tokens)


async def load_adapter(request: Request) -> Response:
    body = await _json_body(request)
    info = await _state(request).model.load(body.get("adapter"))
    return JSONResponse({"status": "loaded", **info})


async def unload_adapter(request: Request) -> Response:
    body = await _json_body(request)
    adapter_id = body.get("id")
    if not isinstance(adapter_id, str) or not adapter_id:
        raise bad_request("'id' must be a non-empty string", param="id")
    result = await _state(request).model.unload(adapter_id)
    return JSONResponse({"status": "unloaded", **result})


def build_app(server: ServerState, shutdown_grace: float = 30.0) -> Starlette:
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/structured_outputs/compile", compile_structured_outputs, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/load_lora_adapter", load_adapter, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload_adapter, methods=["POST"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has already let in-flight requests finish for up to the grace period; abort what is left.
        await server.engine.shutdown(grace_s=0)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, 404: _not_found, 405: _not_allowed})
    app.state.server = server
    app.add_middleware(AuthAndErrors)
    return app


async def _api_error(request: Request, exc: APIError) -> Response:
    return exc.response(request.scope.get("state", {}).get("request_id"))


async def _not_found(request: Request, exc) -> Response:
    return APIError(404, f"no route {request.url.path}", code="not_found").response()


async def _not_allowed(request: Request, exc) -> Response:
    return APIError(405, f"{request.method} not allowed on {request.url.path}", code="method_not_allowed").response()
