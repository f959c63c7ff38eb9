"""Fixtures of the console tests: the tenants tests' cast (owner, teammate, outsider, operator) with Django's test
client signed in as each of them; for the browser tests, Chromium (Playwright) and fresh quota counters."""

import pytest
from django.test import Client

from tests.support.quota_counters import drop_quota_counters
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
    """Drop the quota counters earlier test sessions left in Redis (tests.support.quota_counters says why)."""
    drop_quota_counters()
