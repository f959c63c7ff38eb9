"""Schemathesis against the schema endpoints of /api/schema/: generated requests (valid and not: arbitrary JSON
documents, odd names and text) never make the API answer 500. Path parameters are pinned to a real tenant and
schema so requests reach the views behind the 404 of unknown names."""

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from schemas import services
from tenants import services as tenant_services
from tests.schemas.conftest import INVOICE
from tests.tenants.factories import TenantFactory

schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application()).include(path_regex="/schemas/")


@pytest.fixture(autouse=True)
def _keep_test_connection(db):
    # As Django's test client does: the in-process WSGI app must not close the test's connection per request.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def target(queued_compiles):
    tenant = TenantFactory(slug="fuzzed")
    services.schema_create(tenant=tenant, name="fuzzed", document=INVOICE)
    _, key = tenant_services.api_key_create(tenant=tenant, name="fuzz", scopes=["manage"])
    return {"slug": tenant.slug, "name": "fuzzed", "version": 1}, key


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_error_as_a_manage_key(case, target):
    pinned, key = target
    for name, value in pinned.items():
        if name in (case.path_parameters or {}):
            case.path_parameters[name] = value
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    case.validate_response(response, checks=[not_a_server_error])
