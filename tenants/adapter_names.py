"""What an adapter may be called. The registry names adapters by this rule and an API key restricted to adapters
lists names by it; it lives in tenants, which adapters builds on, so both check the one rule."""

MAX_NAME_LENGTH = 100
# No ':' (it separates the version) and nothing that needs escaping in a URL path segment.
ADAPTER_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"
