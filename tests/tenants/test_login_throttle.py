"""Failed sign-ins are limited per account and per address, on every path (console, API, admin); a refused attempt
looks like a wrong password; a success clears the account's count (found missing by a security probe)."""

import uuid

import pytest
from django.core.cache import cache
from django.urls import reverse
from rest_framework.test import APIClient

from tests.tenants.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def address(settings):
    """A client address of this test alone (the counters live in the shared cache)."""
    settings.LOGIN_FAILURES_PER_ACCOUNT, settings.LOGIN_FAILURES_PER_ADDRESS = 3, 6
    ip = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    cache.delete(f"login-failures:address:{ip}")
    yield ip
    cache.delete(f"login-failures:address:{ip}")


def console_login(client, email, password, ip):
    return client.post(reverse("console:login"), {"username": email, "password": password}, REMOTE_ADDR=ip)


def api_login(email, password, ip):
    return APIClient().post("/api/auth/login/", {"email": email, "password": password}, format="json",
                            REMOTE_ADDR=ip)


def test_an_account_is_refused_after_its_failures_even_with_the_right_password(client, address):
    user = UserFactory(email=f"{uuid.uuid4().hex[:8]}@example.com")
    for _ in range(3):
        assert console_login(client, user.email, "wrong-password", address).status_code == 200
    assert console_login(client, user.email, PASSWORD, address).status_code == 200  # refused, same page
    assert api_login(user.email, PASSWORD, address).status_code == 400
    assert api_login(user.email, PASSWORD, "192.0.2.1").status_code == 400  # the account, from anywhere


def test_an_address_is_refused_after_its_failures_across_accounts(client, address):
    user = UserFactory(email=f"{uuid.uuid4().hex[:8]}@example.com")
    for i in range(6):
        api_login(f"nobody{i}-{uuid.uuid4().hex[:6]}@example.com", "wrong-password", address)
    assert api_login(user.email, PASSWORD, address).status_code == 400
    assert api_login(user.email, PASSWORD, "192.0.2.2").status_code == 200  # another address


def test_a_success_clears_the_accounts_count(client, address):
    user = UserFactory(email=f"{uuid.uuid4().hex[:8]}@example.com")
    for _ in range(2):
        api_login(user.email, "wrong-password", address)
    assert api_login(user.email, PASSWORD, "192.0.2.3").status_code == 200
    for _ in range(2):
        api_login(user.email, "wrong-password", "192.0.2.4")
    assert console_login(client, user.email, PASSWORD, "192.0.2.5").status_code == 302  # 2 + 2 never reached 3
