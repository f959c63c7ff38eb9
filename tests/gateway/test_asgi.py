"""gateway.asgi.APIApp, the bare ASGI app in front of the API-key views, driven in-process with scripted ASGI
messages: what Django's handler did for these paths (body limit, errors, client disconnects) it must still do."""

import asyncio
import json
import logging

from django.http import HttpResponse, StreamingHttpResponse
from django.test import override_settings

from gateway import asgi
from gateway.asgi import APIApp, with_api_handler


class Match:
    def __init__(self, func, **kwargs):
        self.func, self.args, self.kwargs = func, (), kwargs


def scope(path="/v1/completions", method="POST", headers=()):
    return {"type": "http", "method": method, "path": path, "headers": list(headers)}


def serve(view, *, body=b"{}", chunks=None, disconnect_after=None, path="/v1/completions", headers=(),
          monkeypatch=None):
    """Run APIApp on one request; (messages sent, the request the view saw). ``chunks``: the body in parts;
    ``disconnect_after``: seconds after the body until the client goes away (None: it stays)."""
    seen = {}

    async def main():
        parts = chunks if chunks is not None else [body]
        incoming = asyncio.Queue()
        for i, part in enumerate(parts):
            incoming.put_nowait({"type": "http.request", "body": part, "more_body": i < len(parts) - 1})
        sent = []

        async def receive():
            if incoming.empty() and disconnect_after is not None:
                await asyncio.sleep(disconnect_after)
                return {"type": "http.disconnect"}
            if incoming.empty():
                await asyncio.Event().wait()  # a client that stays
            return incoming.get_nowait()

        async def send(message):
            sent.append(message)

        async def recording_view(request, *args, **kwargs):
            seen["request"] = request
            return await view(request, *args, **kwargs)

        monkeypatch.setattr(asgi, "resolve", lambda path: Match(recording_view))
        await APIApp()(scope(path, headers=headers), receive, send)
        return sent

    return asyncio.run(main()), seen.get("request")


def body_of(sent) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_view_answer_is_sent_with_its_length_and_the_request_is_what_the_views_read(monkeypatch):
    async def view(request):
        payload = {"method": request.method, "auth": request.headers.get("authorization"),
                   "accept": request.headers.get("Accept"), "type": request.headers.get("Content-Type"),
                   "body": json.loads(request.body)}
        return HttpResponse(json.dumps(payload), content_type="application/json", status=201)

    headers = [(b"authorization", b"Bearer k.1"), (b"accept", b"a"), (b"accept", b"b"),
               (b"content-type", b"application/json")]
    sent, _ = serve(view, chunks=[b'{"x": ', b"[1, 2]}"], headers=headers, monkeypatch=monkeypatch)
    start = sent[0]
    assert start["status"] == 201
    assert (b"content-length", str(len(body_of(sent))).encode()) in start["headers"]
    assert json.loads(body_of(sent)) == {"method": "POST", "auth": "Bearer k.1", "accept": "a,b",
                                         "type": "application/json", "body": {"x": [1, 2]}}


def test_a_body_over_the_upload_limit_is_refused_by_the_view_as_django_would(monkeypatch):
    async def view(request):
        from django.core.exceptions import RequestDataTooBig

        try:
            _ = request.body
        except RequestDataTooBig:
            return HttpResponse("too big", status=413)
        return HttpResponse("fine")

    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10):
        sent, request = serve(view, chunks=[b"x" * 6, b"y" * 6], monkeypatch=monkeypatch)
        assert sent[0]["status"] == 413 and request._body == b""  # not kept
        sent, _ = serve(view, body=b"x" * 10, monkeypatch=monkeypatch)
        assert sent[0]["status"] == 200


def test_an_unexpected_error_is_an_openai_shaped_500_and_is_logged(monkeypatch, caplog):
    async def view(request):
        raise RuntimeError("the view broke")

    with caplog.at_level(logging.ERROR, logger="gateway.asgi"):
        sent, _ = serve(view, monkeypatch=monkeypatch)
    assert sent[0]["status"] == 500
    assert json.loads(body_of(sent))["error"]["code"] == "internal_error"
    assert "the view broke" in caplog.text


def test_a_client_leaving_while_the_view_works_cancels_the_view_and_nothing_is_sent(monkeypatch):
    state = {}

    async def view(request):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        return HttpResponse("late")

    sent, _ = serve(view, disconnect_after=0.05, monkeypatch=monkeypatch)
    assert state == {"cancelled": True} and sent == []  # and the app returned: the cancellation stayed inside


def test_a_stream_goes_out_part_by_part_and_a_client_leaving_mid_stream_closes_it(monkeypatch):
    state = {"closed": False, "produced": 0}

    async def events():
        try:
            for i in range(100):
                state["produced"] += 1
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0.01)
        finally:
            state["closed"] = True

    async def view(request):
        stream = events()
        response = StreamingHttpResponse(stream, content_type="text/event-stream")
        response.events = stream
        return response

    sent, _ = serve(view, disconnect_after=0.1, monkeypatch=monkeypatch)
    parts = [m for m in sent if m["type"] == "http.response.body"]
    assert sent[0]["status"] == 200 and 3 <= len(parts) < 100
    assert all(m["more_body"] for m in parts) and parts[0]["body"] == b"data: 0\n\n"
    assert state["closed"] and state["produced"] < 100

    async def short():
        yield b"data: a\n\n"
        yield b"data: [DONE]\n\n"

    async def plain_view(request):  # a StreamingHttpResponse without the relay's events: Django's iterator
        return StreamingHttpResponse(short(), content_type="text/event-stream")

    sent, _ = serve(plain_view, monkeypatch=monkeypatch)
    assert body_of(sent) == b"data: a\n\ndata: [DONE]\n\n" and sent[-1] == {"type": "http.response.body", "body": b""}


def test_only_the_api_key_paths_take_the_bare_app(tmp_path):
    calls = []

    async def django_app(scope, receive, send):
        calls.append(scope.get("path", scope["type"]))

    route = with_api_handler(django_app)
    asyncio.run(route({"type": "http", "path": "/v1/playground/acme/chat/completions"}, None, None))
    asyncio.run(route({"type": "http", "path": "/t/acme/"}, None, None))
    assert calls == ["/v1/playground/acme/chat/completions", "/t/acme/"]

    # The lifespan is the usage spool's (gateway.spool), not Django's (which has none).
    incoming = [{"type": "lifespan.shutdown"}, {"type": "lifespan.startup"}]
    sent = []

    async def receive():
        return incoming.pop()

    async def send(message):
        sent.append(message["type"])

    with override_settings(GATEWAY_SPOOL_DIR=str(tmp_path / "spool")):
        asyncio.run(route({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"] and calls == calls[:2]
