from django.apps import AppConfig


class AdaptersConfig(AppConfig):
    name = "adapters"
    default_auto_field = "django.db.models.BigAutoField"
