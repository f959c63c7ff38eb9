"""Fixtures of the gateway tests. Tests through the whole stack (``stack``) write with ``transactional_db`` so the
stack's web process sees their tenants and keys; in-process tests that write from the gateway's database thread
do too."""

import pytest

from tenants.db_thread import close_db_thread_connection
from tests.support.quota_counters import drop_quota_counters


@pytest.fixture(autouse=True)
def _close_gateway_db_thread():
    """The gateway's database thread keeps its connection open; close it so the test database can be dropped."""
    yield
    close_db_thread_connection()


@pytest.fixture(autouse=True)
def _fresh_quota_counters():
    """Drop the quota counters earlier test sessions left in Redis (tests.support.quota_counters says why)."""
    drop_quota_counters()


# The adapter registry's fixtures for adapters made for the stack's served model (test_adapters.py).
from tests.adapters.conftest import served_good_adapter, served_model_dir  # noqa: E402, F401
