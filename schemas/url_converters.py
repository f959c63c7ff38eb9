"""``<schema_name:...>`` in URL patterns: only names the registry accepts reach a view. Registered once, on import,
for the API and the console."""

from django.urls import register_converter

from schemas.models import SCHEMA_NAME_PATTERN


class SchemaNameConverter:
    regex = SCHEMA_NAME_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(SchemaNameConverter, "schema_name")
