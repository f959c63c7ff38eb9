import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_asgi_application()

# Both need the settings configured above.
from adapters.upload_guard import UploadGuard  # noqa: E402
from config.static_files import with_static_files  # noqa: E402
from gateway.asgi import with_api_handler  # noqa: E402

# Streamed adapter uploads are refused from their headers before Django reads their bodies; the inference API's
# key-authenticated calls skip the session/CSRF middleware (gateway.asgi says why).
application = with_static_files(UploadGuard(with_api_handler(django_application)))
