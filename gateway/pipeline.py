"""One completion or chat request from an authenticated caller to an engine and back.

parse (a registered schema named in response_format put inline: gateway.named_schemas) -> resolve the model in
the caller's tenant -> pick replicas -> count the prompt on one (``/tokenize``) ->
choose max_tokens (the tenant's default and limit, the context) -> reserve quota (429 when refused) -> open
the engine stream (the next replica if one cannot take it) -> relay, metering exactly once. With a key cached
in this process, the steps up to the count run while its check in Redis confirms it (gateway.views).
"""

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from engine.contract import ContractError, OpenAIRequest, fit_completion
from gateway import metrics
from gateway.callers import Caller
from gateway.errors import GatewayError, bad_request
from gateway.metering import CANCELLED, ERROR, Meter, spawn
from gateway.named_schemas import inline_registered_schema
from gateway.parsing import check_request, contract_error, engine_body, read_body, tokenize_bodies
from gateway.relay import Relay
from gateway.replicas import rendezvous_score
from gateway.targets import Target, resolve_target
from gateway.upstream import loop_upstream, open_stream, tokenize_prompts
from tenants.effective_quota import EffectiveQuota
from tenants.engine_tags import cache_salt, fairness_key
from tenants.limiter import Refusal, Reservation, reserve

ENGINE_PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
STREAM_START_DEADLINE_S = 30.0  # a stream nobody starts reading by then is ended (see Relay.watch_start)


def completion_budget(quota: EffectiveQuota, parsed: OpenAIRequest, prompt_lengths: list[int],
                      max_model_len: int) -> int:
    """max_tokens for the engine: the client's (within the tenant's limit) or the tenant's default, and room for
    it in the context after the longest prompt (a default shrinks to fit; an explicit value must fit)."""
    try:
        budget = quota.resolve_max_tokens(parsed.max_tokens)
        return min(budget, fit_completion(prompt_lengths, parsed.max_tokens, max_model_len,
                                          prompt_field=parsed.prompt_field, max_tokens_field=parsed.max_tokens_field))
    except ContractError as exc:
        raise contract_error(exc) from None
    except ValueError as exc:
        raise bad_request(f"{exc}.", param=parsed.max_tokens_field, code="max_tokens_over_limit") from None


async def reserve_quota(caller: Caller, parsed: OpenAIRequest, prompt_tokens: int, budget: int) -> Reservation:
    # The limiter reserves one completion budget; each further choice (n, several prompts) adds one more.
    extra = (parsed.num_choices - 1) * budget
    try:
        outcome = await reserve(caller.tenant, caller.key_id, prompt_tokens + extra, budget)
    except ValueError as exc:  # can never fit this tenant's limits, whatever the wait
        raise bad_request(str(exc), param="max_tokens", code="request_too_large") from None
    if isinstance(outcome, Refusal):
        metrics.rate_limited_total.labels(reason=outcome.reason).inc()
        monthly = outcome.reason == "monthly_tokens"
        raise GatewayError(429, outcome.message, headers=outcome.headers,
                           type="insufficient_quota" if monthly else (
                               "tokens" if outcome.reason == "tokens_per_minute" else "requests"),
                           code="insufficient_quota" if monthly else "rate_limit_exceeded")
    return outcome


class CallerChanged(Exception):
    """The confirmed caller differs from the provisional one the request began with (its key or tenant changed
    meanwhile): nothing was reserved, the request is to be answered again with the confirmed caller."""


async def run_generation(caller: Caller, kind: str, raw_body: bytes,
                         confirm: Callable[[], Awaitable[Caller]] | None = None) -> HttpResponse:
    """The response to a completion (``kind="completion"``) or chat request; GatewayError for a refusal.

    ``caller`` may be provisional (the key from the local cache): ``confirm`` then gives the confirmed caller
    (or raises the key's 401/403), awaited after the prompt is counted and before anything is reserved."""
    started = time.monotonic()
    request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    body = read_body(raw_body)
    if kind == "chat":
        body = await inline_registered_schema(caller.tenant.id, body)
    parsed = check_request(kind, body)
    target = await resolve_target(caller, parsed.model)
    upstream = loop_upstream()
    candidates = await upstream.pool.candidates(target.affinity_key)
    prompt_ids, max_model_len = await tokenize_prompts(upstream, candidates, tokenize_bodies(parsed), parsed.model,
                                                   request_id)
    counts = [len(ids) for ids in prompt_ids]
    budget = completion_budget(caller.tenant.quota, parsed, counts, max_model_len)
    if confirm is not None and await confirm() != caller:
        raise CallerChanged
    meter = await _admit(caller, parsed, target, sum(counts), budget, request_id, started)
    body = engine_body(parsed, prompt_ids, engine_model=target.engine_model, max_tokens=budget,
                       adapter=target.adapter.source() if target.adapter else None,
                       fairness_key=fairness_key(caller.tenant.id), fairness_weight=caller.fairness_weight,
                       priority=caller.priority, cache_salt=cache_salt(caller.tenant.id))
    try:
        replica, response = await open_stream(upstream, candidates, ENGINE_PATHS[kind], body, parsed.model,
                                              request_id)
    except asyncio.CancelledError:
        await meter.finish(CANCELLED)
        raise
    except BaseException:
        await meter.finish(ERROR)
        raise
    metrics.overhead_seconds.observe(time.monotonic() - started)
    _count_spill(target, upstream.pool.replicas, replica)
    relay = Relay(parsed, target.model, meter, response, replica, upstream.pool, target.affinity_key)
    headers = {"X-Request-Id": request_id, **meter.reservation.headers}
    if parsed.stream:
        relay.watch_start(STREAM_START_DEADLINE_S)
        events = relay.events()
        response = StreamingHttpResponse(events, content_type="text/event-stream",
                                         headers={**STREAM_HEADERS, **headers})
        response.events = events  # gateway.asgi sends these itself, past Django's wrapping generators
        response.relay = relay  # ended at once if the client leaves before the answer starts (gateway.views)
        return response
    return JsonResponse(await relay.collect(), headers=headers)


async def _admit(caller: Caller, parsed: OpenAIRequest, target: Target, prompt_tokens: int, budget: int,
                 request_id: str, started: float) -> Meter:
    """Reserve and start metering, as one step that a client disconnect cannot split: a reservation made while
    the request was being cancelled is still settled and recorded (as cancelled, with no tokens)."""

    async def admit() -> Meter:
        reservation = await reserve_quota(caller, parsed, prompt_tokens, budget)
        return Meter(request_id=request_id, caller=caller, target=target, reservation=reservation,
                     started_at=started)

    task = spawn(admit())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_finish_orphan)
        raise


def _finish_orphan(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is None:
        spawn(task.result().finish(CANCELLED))


def _count_spill(target: Target, replicas, chosen) -> None:
    if target.affinity_key is None:
        return
    preferred = max(replicas, key=lambda r: rendezvous_score(target.affinity_key, r.url))
    if chosen is not preferred:
        metrics.spills_total.inc()
