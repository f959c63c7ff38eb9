"""Static files (the console's CSS and JS, the npm libraries in static/vendor/, the admin's) served by the ASGI
app itself, so `make run`, the tests and the production image need no separate file server.

With DEBUG they come straight from the source folders through Django's finders, as `runserver` does. Without
DEBUG they come from STATIC_ROOT (what `collectstatic` wrote into the image) through Starlette's StaticFiles:
an ASGI app (WhiteNoise's middleware is sync-only and would push every request of the async gateway through a
thread) that answers ETag, Last-Modified and 304s."""

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.staticfiles import StaticFiles


def with_static_files(app):
    """`app` with STATIC_URL's paths answered from the static files; a STATIC_URL on another host is left alone."""
    if "://" in settings.STATIC_URL or settings.STATIC_URL.startswith("//"):
        return app
    if settings.DEBUG:
        return ASGIStaticFilesHandler(app)
    prefix = "/" + settings.STATIC_URL.strip("/")
    files = ExceptionMiddleware(StaticFiles(directory=settings.STATIC_ROOT, check_dir=False))  # 404s as responses

    async def route(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(prefix + "/"):
            # StaticFiles looks the path up below its root_path
            await files({**scope, "root_path": prefix}, receive, send)
        else:
            await app(scope, receive, send)

    return route
