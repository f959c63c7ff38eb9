"""Fixtures of the schema registry tests: the tenants tests' cast of callers, and the compile tasks kept in this
process (a transactional test's commit would otherwise hand them to a whole-stack worker of this session)."""

import pytest

from tests.tenants.conftest import Cast, cast, client_for  # noqa: F401 (shared fixtures)

INVOICE = {
    "type": "object",
    "properties": {"number": {"type": "integer", "minimum": 1}, "currency": {"enum": ["EUR", "USD"]}},
    "required": ["number", "currency"],
    "additionalProperties": False,
}


@pytest.fixture
def queued_compiles(monkeypatch) -> list[int]:
    """The version ids whose warm compile was queued (on commit), instead of sending them to a broker."""
    from schemas import tasks

    sent = []
    monkeypatch.setattr(tasks.schema_version_compile, "delay", lambda version_id: sent.append(version_id))
    return sent
