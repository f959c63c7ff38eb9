"""The quota a tenant is held to: its overrides over the platform defaults (settings.TENANT_QUOTA_DEFAULTS).

Plain data, free of the ORM, so the gateway can cache it beside a key and the limiter can run in any process.
"""

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True, slots=True)
class EffectiveQuota:
    requests_per_minute: int
    tokens_per_minute: int
    monthly_tokens: int
    max_concurrent_requests: int
    default_max_tokens: int
    max_tokens_limit: int
    max_adapters: int
    max_adapter_storage_bytes: int

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"quota {field.name} must be a positive integer, got {value!r}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"quota default_max_tokens ({self.default_max_tokens}) exceeds "
                             f"max_tokens_limit ({self.max_tokens_limit})")

    @classmethod
    def merge(cls, defaults: dict[str, int], overrides: dict[str, int | None]) -> "EffectiveQuota":
        """Each field from `overrides` unless it is None, else from `defaults`."""
        values = {}
        for field in fields(cls):
            override = overrides.get(field.name)
            values[field.name] = defaults[field.name] if override is None else override
        return cls(**values)

    def resolve_max_tokens(self, requested: int | None) -> int:
        """The completion budget of one request: the default when absent; ValueError when over the limit."""
        if requested is None:
            return self.default_max_tokens
        if not isinstance(requested, int) or isinstance(requested, bool) or requested < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {requested!r}")
        if requested > self.max_tokens_limit:
            raise ValueError(f"max_tokens {requested} exceeds this tenant's limit of {self.max_tokens_limit}")
        return requested

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def platform_default_quota() -> EffectiveQuota:
    from django.conf import settings  # read at call time: no settings at import time in library code

    return EffectiveQuota(**settings.TENANT_QUOTA_DEFAULTS)
