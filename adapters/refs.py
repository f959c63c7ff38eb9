"""How callers name adapters: ``name`` (the latest ready version) or ``name:version`` (that version)."""

import re
from dataclasses import dataclass

from tenants.adapter_names import ADAPTER_NAME_PATTERN

_REF = re.compile(rf"({ADAPTER_NAME_PATTERN})(?::([1-9][0-9]{{0,8}}))?")


@dataclass(frozen=True, slots=True)
class AdapterRef:
    name: str
    version: int | None  # None: the latest ready version


def parse_adapter_ref(ref: str) -> AdapterRef:
    """``"sql"`` -> AdapterRef("sql", None); ``"sql:3"`` -> AdapterRef("sql", 3); ValueError otherwise."""
    match = _REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise ValueError(
            f"adapter reference {ref!r} must be NAME or NAME:VERSION (name: letters, digits, '.', '_', '-'; "
            "version: a positive integer)"
        )
    return AdapterRef(match[1], int(match[2]) if match[2] else None)
