"""The gateway's side of ENGINE_PROTOCOL.md: one ``httpx.AsyncClient`` and one replica pool per event loop, prompt
counting with ``/tokenize``, and opening a generation stream on the first replica that takes it.

A replica that cannot be connected to, or answers 503 (its queue is full), is passed over for the next candidate:
nothing was generated there, so trying elsewhere cannot double anything. Every other engine error is final.
"""

import asyncio
import json
import logging
import weakref
from dataclasses import dataclass, field

import httpx
from django.conf import settings

from adapters.engine_client import EngineError, engine_headers
from engine.contract import excerpt
from gateway import metrics
from gateway.engine_transport import EngineTransport
from gateway.errors import GatewayError, bad_request, model_not_found
from gateway.replicas import Replica, ReplicaPool

logger = logging.getLogger("gateway.upstream")


@dataclass(slots=True)
class Upstream:
    http: httpx.AsyncClient
    transport: httpx.AsyncBaseTransport  # the client's own
    pool: ReplicaPool
    _urls: dict[str, httpx.URL] = field(default_factory=dict)

    async def post(self, url: str, body: dict, request_id: str, *, stream: bool = False) -> httpx.Response:
        """POST ``body`` as JSON with the shared client's timeouts, sent on its transport directly: the client's
        request building (URL merging, default headers), cookie jar, auth and redirect layers cost a good part of
        a millisecond per call on this machine, and engines need none of them. With ``stream`` the body is left
        to read; close the response."""
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)  # a replica's few paths, parsed once
        headers = {**engine_headers(self.pool.api_key, request_id), "Content-Type": "application/json"}
        request = httpx.Request("POST", parsed, content=json.dumps(body).encode(), headers=headers,
                                extensions={"timeout": self.http.timeout.as_dict()})
        response = await self.transport.handle_async_request(request)
        response.request = request
        if not stream:
            try:
                await response.aread()
            finally:
                await response.aclose()
        return response


_upstreams: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Upstream]" = weakref.WeakKeyDictionary()


def loop_upstream() -> Upstream:
    """This event loop's client and pool over settings.ENGINE_URLS (httpx connections belong to one loop)."""
    loop = asyncio.get_running_loop()
    upstream = _upstreams.get(loop)
    if upstream is None:
        timeout = httpx.Timeout(connect=settings.GATEWAY_ENGINE_CONNECT_TIMEOUT_MS / 1000,
                                read=settings.GATEWAY_ENGINE_READ_TIMEOUT_S, write=30.0, pool=30.0)
        transport = EngineTransport(max_connections=settings.GATEWAY_MAX_ENGINE_CONNECTIONS)
        http = httpx.AsyncClient(timeout=timeout, transport=transport)
        pool = ReplicaPool(settings.ENGINE_URLS, http, settings.ENGINE_API_KEY,
                           ttl_s=settings.GATEWAY_HEALTH_TTL_MS / 1000)
        upstream = _upstreams[loop] = Upstream(http, transport, pool)
    return upstream


class ReplicaUnavailable(Exception):
    """This replica cannot take the request now (no connection, or 503): try the next one."""

    def __init__(self, replica: Replica, reason: str, retry_after: str | None = None):
        super().__init__(f"{replica.url}: {reason}")
        self.retry_after = retry_after


async def on_first_available(candidates: list[Replica], attempt):
    """``await attempt(replica)`` on each candidate until one does not raise ReplicaUnavailable; else a 503 whose
    Retry-After is the longest an engine asked for (1 s when none said)."""
    retry_after = 1
    for replica in candidates:
        try:
            return replica, await attempt(replica)
        except ReplicaUnavailable as exc:
            if exc.retry_after and exc.retry_after.isdigit():
                retry_after = max(retry_after, int(exc.retry_after))
    raise GatewayError(503, f"No engine could take the request ({len(candidates)} tried); retry shortly.",
                       code="engine_unavailable", headers={"Retry-After": str(retry_after)})


_MAX_RELAYED_CHARS = 512  # of an engine's refusal, relayed to the client (the engine quotes excerpts already)


def engine_error(exc: EngineError, model: str) -> GatewayError:
    """An engine's refusal of a request as the client's error."""
    message = excerpt(exc.message.split(": ", 1)[-1], _MAX_RELAYED_CHARS)
    if exc.status == 400:
        return bad_request(message, code=exc.code, param=exc.param)
    if exc.status == 404:
        return model_not_found(model)
    if exc.status == 413:
        return bad_request(message, code="context_length_exceeded", param=exc.param or "max_tokens")
    metrics.engine_errors_total.labels(kind=f"http_{exc.status}").inc()
    logger.error("engine refused a request: %s", exc)
    code = "model_unavailable" if exc.status == 422 else "engine_error"
    return GatewayError(502, "The model could not serve this request.", code=code)


async def _check(replica: Replica, response: httpx.Response, model: str) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    if response.status_code == 503:
        metrics.engine_errors_total.labels(kind="overloaded").inc()
        raise ReplicaUnavailable(replica, "overloaded", response.headers.get("retry-after"))
    raise engine_error(EngineError.from_response(response), model)


def _connect_failed(pool: ReplicaPool, replica: Replica, exc: Exception) -> ReplicaUnavailable:
    metrics.engine_errors_total.labels(kind="connect").inc()
    pool.mark_down(replica)
    return ReplicaUnavailable(replica, f"{type(exc).__name__}: {exc}")


async def tokenize_prompts(upstream: Upstream, candidates: list[Replica], bodies: list[dict], model: str,
                       request_id: str) -> tuple[list[list[int]], int]:
    """Each prompt's token ids (chat template applied) and the context length, from one replica."""

    async def one(replica: Replica, body: dict) -> dict:
        try:
            response = await upstream.post(f"{replica.url}/tokenize", body, request_id)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise _connect_failed(upstream.pool, replica, exc) from None
        except httpx.TransportError as exc:  # counting is idempotent: another replica may answer
            raise ReplicaUnavailable(replica, f"{type(exc).__name__}: {exc}") from None
        await _check(replica, response, model)
        return response.json()

    async def attempt(replica: Replica) -> tuple[list[list[int]], int]:
        results = await asyncio.gather(*(one(replica, body) for body in bodies))
        return [r["tokens"] for r in results], min(r["max_model_len"] for r in results)

    return (await on_first_available(candidates, attempt))[1]


async def open_stream(upstream: Upstream, candidates: list[Replica], path: str, body: dict, model: str,
                      request_id: str) -> tuple[Replica, httpx.Response]:
    """POST the generation request to ``path``; the replica that took it and its open (status 200) SSE response."""

    async def attempt(replica: Replica) -> httpx.Response:
        try:
            response = await upstream.post(f"{replica.url}{path}", body, request_id, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise _connect_failed(upstream.pool, replica, exc) from None
        except httpx.TimeoutException:
            metrics.engine_errors_total.labels(kind="timeout").inc()
            raise GatewayError(504, "The engine did not answer in time.", code="engine_timeout") from None
        except httpx.TransportError as exc:
            metrics.engine_errors_total.labels(kind="transport").inc()
            upstream.pool.mark_down(replica)
            raise GatewayError(502, "The engine failed before answering.", code="engine_failed") from exc
        try:
            await _check(replica, response, model)
        except BaseException:
            await response.aclose()
            raise
        return response

    return await on_first_available(candidates, attempt)
