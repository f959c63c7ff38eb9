"""ASGI middleware: a streamed adapter upload is judged from its headers before its body is read.

Django's ASGI handler reads a request's whole body (to a temporary file) before any view runs. For
``POST /api/tenants/<slug>/adapters/<name>/versions/`` this middleware first runs the same view on a body-less
copy of the request, marked with :data:`PREFLIGHT_META_KEY`: authentication, tenant access, media type and the
Content-Length against the platform limit and the tenant's storage quota. A refusal (401, 403, 404, 411, 413,
415, ...) is answered at once, without reading a byte of the body, and the connection is closed; an admitted
request goes on to Django, whose view checks everything again before it stages the bytes.
"""

import io

from asgiref.sync import sync_to_async

# Set on the body-less copy; clients cannot set it (their headers become HTTP_* keys of META).
PREFLIGHT_META_KEY = "adapters.upload_preflight"
_UPLOAD_ROUTE = ("adapters-api", "versions")


class UploadGuard:
    def __init__(self, app):
        self.app = app
        self._handler = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and _is_streamed_upload(scope):
            response = await sync_to_async(self._preflight, thread_sensitive=True)(scope)
            if response is not None:
                await _send(send, response)
                return
        await self.app(scope, receive, send)

    def _preflight(self, scope):
        """The view's answer to the body-less request, or None when it admits the upload."""
        from django.core.handlers.asgi import ASGIRequest
        from django.core.handlers.base import BaseHandler
        from django.db import close_old_connections

        if self._handler is None:
            handler = BaseHandler()
            handler.load_middleware(is_async=False)
            self._handler = handler
        request = ASGIRequest(scope, io.BytesIO())
        request.META[PREFLIGHT_META_KEY] = True
        close_old_connections()
        try:
            response = self._handler.get_response(request)
        finally:
            close_old_connections()
        return None if getattr(response, "upload_admitted", False) else response


def _is_streamed_upload(scope) -> bool:
    from django.urls import Resolver404, resolve

    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return (match.namespace, match.url_name) == _UPLOAD_ROUTE


async def _send(send, response) -> None:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]
    headers.append((b"connection", b"close"))  # the unread body must not be taken for a next request
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})
