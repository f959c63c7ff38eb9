from django.apps import AppConfig


class SchemasConfig(AppConfig):
    name = "schemas"
    default_auto_field = "django.db.models.BigAutoField"
