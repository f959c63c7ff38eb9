"""``FairShare``: whose a request is, for fair admission (:mod:`engine.fairness`); torch-free, set once per request."""

from dataclasses import dataclass

PRIORITIES = ("interactive", "batch")  # served in this order
MAX_WEIGHT = 1000.0
MAX_KEY_CHARS = 256


@dataclass(frozen=True, slots=True)
class FairShare:
    """What a request says about whose it is: set once from ``add_request``."""

    key: str | None = None
    weight: float = 1.0
    priority: int = 0  # index in PRIORITIES

    @classmethod
    def of(cls, key: str | None, weight: float | None, priority: str | None) -> "FairShare":
        """Checked values; ValueError naming the field."""
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS):
            raise ValueError(f"fairness_key must be a non-empty string of at most {MAX_KEY_CHARS} characters")
        if weight is None:
            weight = 1.0
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= MAX_WEIGHT:
            raise ValueError(f"fairness_weight must be a number in (0, {MAX_WEIGHT:g}]")
        if priority is None:
            priority = PRIORITIES[0]
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        return cls(key, float(weight), PRIORITIES.index(priority))


UNKEYED = FairShare()  # every request without a key shares this one
