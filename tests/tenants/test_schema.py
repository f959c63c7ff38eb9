"""Schemathesis against /api/schema/: generated requests (valid and not) never make the API answer 500.

Run as a tenant's manage key and as an operator's session; the tenant path parameter is pinned to a real tenant
so that requests reach the views behind the 404 of an unknown slug."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.test import Client
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tenants import services
from tests.support.fuzz import keep_test_connection  # noqa: F401 (fixture)
from tests.tenants.factories import MembershipFactory, TenantFactory, UserFactory

CSRF = "s" * 32  # a well-formed CSRF secret, sent as cookie and header alike


# Loaded when the module is collected (the schema view needs no database); schemathesis's fixture-based lazy
# loader does not work with pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


pytestmark = pytest.mark.usefixtures("keep_test_connection")


@pytest.fixture
def tenant(db):
    tenant = TenantFactory(slug="fuzzed")
    MembershipFactory(tenant=tenant, role="admin")
    return tenant


@pytest.fixture
def manage_key_headers(tenant):
    _, raw = services.api_key_create(tenant=tenant, name="fuzz", scopes=["manage", "inference"])
    return {"Authorization": f"Bearer {raw}"}


@pytest.fixture
def operator_headers(db):
    client = Client()
    client.force_login(UserFactory(is_staff=True))
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}; csrftoken={CSRF}", "X-CSRFToken": CSRF}


def call_and_check(case, tenant, headers):
    if "slug" in (case.path_parameters or {}):
        case.path_parameters["slug"] = tenant.slug
    response = case.call(headers=headers)
    case.validate_response(response, checks=[not_a_server_error])


FUZZ = settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_no_server_error_as_a_manage_key(case, tenant, manage_key_headers):
    call_and_check(case, tenant, manage_key_headers)


@pytest.mark.slow
@schema.parametrize()
@FUZZ
def test_no_server_error_as_an_operator(case, tenant, operator_headers):
    call_and_check(case, tenant, operator_headers)
