from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "adapters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from adapters import signals  # noqa: F401 - connects the receivers
