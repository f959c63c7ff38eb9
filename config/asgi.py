import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_asgi_application()

from adapters.upload_guard import UploadGuard  # noqa: E402 (after Django is set up)

# Streamed adapter uploads are refused from their headers before Django reads their bodies.
application = UploadGuard(django_application)
