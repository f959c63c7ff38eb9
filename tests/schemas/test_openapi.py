"""Schemathesis against the schema endpoints of /api/schema/: generated requests (valid and not: arbitrary JSON
documents, odd names and text) never make the API answer 500. Path parameters are pinned to a real tenant and
schema so requests reach the views behind the 404 of unknown names."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings

from schemas import services
from tenants import services as tenant_services
from tests.schemas.conftest import INVOICE
from tests.support.fuzz import call_pinned, keep_test_connection  # noqa: F401 (fixture)
from tests.tenants.factories import TenantFactory

schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application()).include(path_regex="/schemas/")


pytestmark = pytest.mark.usefixtures("keep_test_connection")


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
    call_pinned(case, *target)
