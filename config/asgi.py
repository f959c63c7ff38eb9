import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_asgi_application()

# Both need the settings configured above.
from adapters.upload_guard import UploadGuard  # noqa: E402
from config.static_files import with_static_files  # noqa: E402

# Streamed adapter uploads are refused from their headers before Django reads their bodies.
application = with_static_files(UploadGuard(django_application))
