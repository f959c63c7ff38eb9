"""The API-key endpoints of /v1/ served by a Django ASGI handler without middleware.

Django runs each ``MiddlewareMixin`` middleware's ``process_request`` and ``process_response`` through
``sync_to_async`` under ASGI: with the project's seven, that is fourteen thread hand-offs per request, measured
at several milliseconds of added time to first token on this 2-core machine. Calls with an API key need none of
them (no session, no CSRF cookie, no messages, no HTML to frame), so they go to a handler whose middleware chain
is empty; the views, URLconf, signals and database handling are Django's as usual. The playground
(``/v1/playground/``) is signed in with a session and keeps the full stack.
"""

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

API_PREFIX = "/v1/"
SESSION_PREFIX = "/v1/playground/"


class APIHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain, and no thread of its own per request.

    Django runs each request in a ``ThreadSensitiveContext``: a new thread per request for its few synchronous
    steps (the request signals, closing the response), started and joined every time. These views do their
    database work on the gateway's own database thread (gateway.db), so the remaining steps go to asgiref's one
    shared thread instead."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(
            self._get_response_async if is_async else self._get_response)


def with_api_handler(app):
    """``app`` with the API-key paths of /v1/ answered by :class:`APIHandler`."""
    api = APIHandler()

    async def route(scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(API_PREFIX) and not path.startswith(SESSION_PREFIX):
            await api(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
