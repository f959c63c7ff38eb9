"""The quota a tenant is held to: its overrides over the platform defaults (settings.TENANT_QUOTA_DEFAULTS).

Plain data, free of the ORM, so the gateway can cache it beside a key and the limiter can run in any process.
"""

from dataclasses import asdict, dataclass, fields

from tenants.priority import INTERACTIVE, MAX_FAIRNESS_WEIGHT, PRIORITY_CODES, PRIORITY_NAMES, priority_name


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
    # Defaults so that a quota built by hand for the limiter alone needs no say in fair service.
    fairness_weight: int = 1
    priority_class: int = PRIORITY_CODES[INTERACTIVE]  # a code of tenants.priority; `priority` is its name

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"quota {field.name} must be a positive integer, got {value!r}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"quota default_max_tokens ({self.default_max_tokens}) exceeds "
                             f"max_tokens_limit ({self.max_tokens_limit})")
        if self.fairness_weight > MAX_FAIRNESS_WEIGHT:
            raise ValueError(f"quota fairness_weight must be at most {MAX_FAIRNESS_WEIGHT}, got {self.fairness_weight}")
        if self.priority_class not in PRIORITY_NAMES:
            raise ValueError(f"quota priority_class must be one of the codes {sorted(PRIORITY_NAMES)}, "
                             f"got {self.priority_class}")

    @property
    def priority(self) -> str:
        """The name of the priority class the tenant's requests get (a key may still mark its own batch)."""
        return priority_name(self.priority_class)

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
