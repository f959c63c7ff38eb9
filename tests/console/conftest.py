"""Fixtures of the console tests: the tenants tests' cast (owner, teammate, outsider, operator) with Django's test
client signed in as each of them."""

import pytest
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
