"""Fixtures of the gateway tests. Tests through the whole stack (``stack``) write with ``transactional_db`` so the
stack's web process sees their tenants and keys; in-process tests that write from the gateway's database thread
do too."""

import pytest
import redis
from django.conf import settings

from gateway.db import close_db_thread_connection


@pytest.fixture(autouse=True)
def _close_gateway_db_thread():
    """The gateway's database thread keeps its connection open; close it so the test database can be dropped."""
    yield
    close_db_thread_connection()


@pytest.fixture(autouse=True)
def _fresh_quota_counters():
    """Drop the limiter's counters left in Redis by earlier test sessions: the test database starts its ids at 1
    again, so a new tenant would inherit an old one's month. Only the quota keys: the stack's Celery worker
    uses the same Redis database as its broker."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        stale = list(client.scan_iter(match="quota:*", count=1000))
        if stale:
            client.delete(*stale)
    finally:
        client.close()


# The adapter registry's fixtures for adapters made for the stack's served model (test_adapters.py).
from tests.adapters.conftest import served_good_adapter, served_model_dir  # noqa: E402, F401
