"""``<adapter_name:...>`` in URL patterns: only names the registry accepts reach a view (a NUL byte, which
PostgreSQL text refuses with a 500, or a slash never does). Registered once, on import, for the API and the console."""

from django.urls import register_converter

from tenants.adapter_names import ADAPTER_NAME_PATTERN


class AdapterNameConverter:
    regex = ADAPTER_NAME_PATTERN

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class KeyPrefixConverter:
    """An API key's public prefix."""

    regex = "[A-Za-z0-9]{1,8}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(AdapterNameConverter, "adapter_name")
register_converter(KeyPrefixConverter, "key_prefix")
