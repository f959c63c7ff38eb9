"""The OpenAI-compatible endpoints (API keys) and the console's playground (session): thin async views over
:mod:`gateway.pipeline` and :mod:`gateway.targets`. Every answer is OpenAI-shaped, errors included, and every
answer to an authenticated caller carries the tenant's x-ratelimit-* headers."""

import asyncio
import functools
import logging
import time

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.csrf import csrf_exempt

from gateway import metrics
from gateway.callers import Caller, caller_from_key, caller_from_session, provisional_caller
from gateway.errors import GatewayError, outage_error, outage_service
from gateway.pipeline import run_generation
from gateway.targets import model_detail, model_list
from tenants.limiter import peek

logger = logging.getLogger("gateway")


def openai_endpoint(endpoint: str, method: str):
    """Allow only ``method``; turn GatewayErrors into OpenAI error responses, add the rate-limit headers, count
    the answer."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapped(request, *args, **kwargs):
            started = time.monotonic()
            state = {}  # the view puts the caller here once known
            try:
                if request.method != method:
                    raise GatewayError(405, f"{request.method} is not allowed here; use {method}.",
                                       code="method_not_allowed", headers={"Allow": method})
                response = await view(request, state, *args, **kwargs)
            except GatewayError as exc:
                response = exc.response()
            except RequestDataTooBig:
                response = GatewayError(413, "The request body is too large.", code="body_too_large").response()
            except Exception as exc:
                outage = outage_error(exc)
                if outage is None:
                    raise
                metrics.outages_total.labels(service=outage_service(exc)).inc()
                logger.warning("%s answered 503: %r", endpoint, exc)
                state.pop("caller", None)  # no x-ratelimit-* headers: they would wait on the same outage
                response = outage.response()
            if "caller" in state and "x-ratelimit-limit-requests" not in response:
                try:
                    await _add_rate_headers(response, state["caller"])
                except asyncio.CancelledError:  # the client left: an engine stream opened for it ends now
                    relay = getattr(response, "relay", None)
                    if relay is not None:
                        relay.abandon()
                    raise
            metrics.requests_total.labels(endpoint=endpoint, status=str(response.status_code)).inc()
            if not response.streaming:
                metrics.request_seconds.labels(endpoint=endpoint).observe(time.monotonic() - started)
            return response

        return wrapped

    return decorate


async def _add_rate_headers(response: HttpResponse, caller: Caller) -> None:
    try:
        headers = await peek(caller.tenant)
    except Exception:  # an answer without its headers beats no answer
        logger.exception("x-ratelimit-* headers unavailable")
        return
    for name, value in headers.items():
        response[name] = value


async def _generate(request, state: dict, kind: str) -> HttpResponse:
    provisional = provisional_caller(request)
    if provisional is None:  # not cached in this process: confirmed first, as on every other endpoint
        state["caller"] = await caller_from_key(request)
        return await run_generation(state["caller"], kind, request.body)
    # The key's check (a Redis read) runs while the prompt is parsed, resolved and counted. Nothing is reserved
    # and no answer goes out before it confirms the cached key: an error found meanwhile waits for it too, and
    # gives way to the key's own 401/403.
    confirmation = asyncio.ensure_future(caller_from_key(request))

    async def confirm() -> Caller:
        state["caller"] = await confirmation
        return state["caller"]

    try:
        return await run_generation(provisional, kind, request.body, confirm=confirm)
    except asyncio.CancelledError:
        confirmation.cancel()
        raise
    except Exception:
        if await confirm() == provisional:
            raise
    # The key or its tenant changed since it was cached (a quota, its adapters): answered as it is now.
    return await run_generation(state["caller"], kind, request.body)


@csrf_exempt
@openai_endpoint("completions", "POST")
async def completions(request, state):
    return await _generate(request, state, "completion")


@csrf_exempt
@openai_endpoint("chat_completions", "POST")
async def chat_completions(request, state):
    return await _generate(request, state, "chat")


@openai_endpoint("models", "GET")
async def models(request, state):
    state["caller"] = await caller_from_key(request)
    return JsonResponse({"object": "list", "data": await model_list(state["caller"])})


@openai_endpoint("models", "GET")
async def model(request, state, model_id: str):
    state["caller"] = await caller_from_key(request)
    return JsonResponse(await model_detail(state["caller"], model_id))


# ---------------------------------------------------------------- the console's playground (session + CSRF)


@openai_endpoint("playground", "POST")
async def playground_chat(request, state, slug: str):
    state["caller"] = await caller_from_session(request, slug)
    return await run_generation(state["caller"], "chat", request.body)


@openai_endpoint("playground", "POST")
async def playground_completions(request, state, slug: str):
    state["caller"] = await caller_from_session(request, slug)
    return await run_generation(state["caller"], "completion", request.body)


@openai_endpoint("playground", "GET")
async def playground_models(request, state, slug: str):
    state["caller"] = await caller_from_session(request, slug)
    return JsonResponse({"object": "list", "data": await model_list(state["caller"])})


def csrf_failure(request, reason: str = "") -> HttpResponse:
    """A forged or token-less POST: under /v1/ (the playground) the API's JSON error, elsewhere Django's page."""
    if request.path.startswith("/v1/"):
        return GatewayError(403, f"CSRF verification failed ({reason}). The playground is called from the console "
                                 "with its X-CSRFToken header; API calls use an API key.",
                            code="csrf_failed").response()
    return django_csrf_failure(request, reason)


async def not_found(request, path: str) -> HttpResponse:
    return GatewayError(404, f"Unknown request URL: {request.method} /v1/{path}.", code="unknown_url").response()
