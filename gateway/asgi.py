"""The API-key endpoints of /v1/ answered by a bare ASGI app around the same Django views.

Django's ASGI handler costs an API call more than the call itself on a small machine: every
``MiddlewareMixin`` middleware's hooks run through ``sync_to_async`` (fourteen thread hand-offs with the project's
seven), the request signals and the response's ``close`` are more thread hand-offs, and each streamed chunk
passes through three wrapping generators. Calls with an API key need none of it: no session, no CSRF cookie,
no messages, no HTML, and their database work runs on the gateway's own database thread (tenants.db_thread). So
:class:`APIApp` reads the request, resolves its view with Django's URLconf, awaits the view (the same views,
answering the same ``HttpResponse`` objects) and writes the answer itself; a streamed answer goes from the relay
to the server with nothing in between. Like Django, it cancels the view when the client disconnects, which is
how a stream's engine request is aborted and metered as cancelled. The playground (``/v1/playground/``) is
signed in with a session and keeps Django's full stack.
"""

import asyncio
import contextlib
import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.http.request import HttpHeaders
from django.urls import Resolver404, resolve

from gateway.errors import GatewayError
from gateway.spool import lifespan

API_PREFIX = "/v1/"
SESSION_PREFIX = "/v1/playground/"

logger = logging.getLogger("gateway.asgi")


class APIRequest:
    """What the API views read of a request: ``method``, ``path``, ``headers`` and ``body`` (which raises
    RequestDataTooBig past DATA_UPLOAD_MAX_MEMORY_SIZE, as Django's does)."""

    __slots__ = ("method", "path", "headers", "_body", "_too_big")

    def __init__(self, scope: dict, body: bytes, too_big: bool):
        self.method = scope["method"]
        self.path = scope["path"]
        self.headers = HttpHeaders(_meta(scope["headers"]))
        self._body = body
        self._too_big = too_big

    @property
    def body(self) -> bytes:
        if self._too_big:
            raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")
        return self._body


def _meta(headers) -> dict[str, str]:
    """The headers as Django's META names them (repeated ones joined with commas, as Django joins them)."""
    meta: dict[str, str] = {}
    for name, value in headers:
        lower = name.decode("latin1").lower()
        key = lower.upper().replace("-", "_")
        if lower not in ("content-type", "content-length"):
            key = f"HTTP_{key}"
        value = value.decode("latin1")
        meta[key] = f"{meta[key]},{value}" if key in meta else value
    return meta


async def _read_body(receive) -> tuple[bytes, bool] | None:
    """(the body, whether it was over the limit), or None when the client left before sending it all."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    parts, size, too_big = [], 0, False
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            too_big = True
            parts.clear()  # drained, not kept
        elif chunk:
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts), too_big


def _headers(response: HttpResponse) -> list[tuple[bytes, bytes]]:
    return [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]


class APIApp:
    async def __call__(self, scope, receive, send):
        read = await _read_body(receive)
        if read is None:
            return
        request = APIRequest(scope, *read)
        serving = asyncio.current_task()
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, serving))
        try:
            response = await self._view_response(request)
            await self._send(response, send)
        except asyncio.CancelledError:
            if not watcher.done() or watcher.cancelled() or not watcher.result():
                raise  # not the client leaving: the server is stopping
            serving.uncancel()  # the client's leaving is handled here: the task goes on as not cancelled
        finally:
            watcher.cancel()

    @staticmethod
    async def _view_response(request: APIRequest) -> HttpResponse:
        try:
            match = resolve(request.path)
        except Resolver404:
            return GatewayError(404, f"Unknown request URL: {request.method} {request.path}.",
                                code="unknown_url").response()
        try:
            return await match.func(request, *match.args, **match.kwargs)
        except Exception:
            logger.exception("%s %s failed", request.method, request.path)
            return GatewayError(500, "The server had an error while processing your request.",
                                type="server_error", code="internal_error").response()

    @staticmethod
    async def _send(response: HttpResponse, send) -> None:
        if not response.streaming:
            body = response.content
            headers = _headers(response)
            if not response.has_header("Content-Length"):
                headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": response.status_code, "headers": _headers(response)})
        events = getattr(response, "events", None)  # the relay's own iterator, when the pipeline made it
        async with contextlib.aclosing(events if events is not None else aiter(response)) as parts:
            async for part in parts:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _cancel_on_disconnect(receive, serving: asyncio.Task) -> bool:
    """Wait for the client to leave and cancel the task serving it; True once it did."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            serving.cancel()
            return True


def with_api_handler(app):
    """``app`` with the API-key paths of /v1/ answered by :class:`APIApp`, and the ASGI lifespan by
    gateway.spool."""
    api = APIApp()

    async def route(scope, receive, send):
        if scope["type"] == "lifespan":  # the usage spool (gateway.spool); Django has no lifespan of its own
            await lifespan(receive, send)
            return
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(API_PREFIX) and not path.startswith(SESSION_PREFIX):
            await api(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
