import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_asgi_application()

from config.static_files import with_static_files  # noqa: E402  (needs the settings configured above)

application = with_static_files(django_application)
