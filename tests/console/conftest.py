"""Fixtures of the console tests: the tenants tests' cast (owner, teammate, outsider, operator) with Django's test
client signed in as each of them; for the browser tests, Chromium (Playwright) and fresh quota counters."""

import pytest
import redis
from django.conf import settings
from django.test import Client

from tests.tenants.conftest import Cast, cast  # noqa: F401  (the cast fixture, shared)

WHO = ("owner", "teammate", "outsider", "operator", "anonymous")


@pytest.fixture
def client_as(cast: Cast):  # noqa: F811
    """client_as("owner" | "teammate" | "outsider" | "operator" | "anonymous") -> a signed-in test Client."""

    def make(who: str) -> Client:
        client = Client()
        if who != "anonymous":
            if who not in WHO:
                raise ValueError(f"unknown person {who!r}")
            client.force_login(getattr(cast, who))
        return client

    return make


@pytest.fixture(scope="module")
def chromium(stack):
    """Debian's Chromium through Playwright, headless, for one test module."""
    from tests.console.browser import launched_chromium

    with launched_chromium() as browser:
        yield browser


@pytest.fixture
def fresh_quota_counters():
    """Drop the limiter's counters left in Redis by earlier test sessions (a new test database numbers tenants
    from 1 again, so a tenant would inherit an old one's month). Only the quota keys: the stack's Celery worker
    uses the same Redis database as its broker."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        stale = list(client.scan_iter(match="quota:*", count=1000))
        if stale:
            client.delete(*stale)
    finally:
        client.close()
