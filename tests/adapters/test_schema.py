"""Schemathesis against the adapter endpoints of /api/schema/: generated requests (valid and not), uploads
included, never make the API answer 500. The path parameters are pinned to a real tenant and adapter so that
requests reach the views behind the 404 of unknown names."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings

from adapters import services
from tenants import services as tenant_services
from tests.support.fuzz import call_pinned, keep_test_connection  # noqa: F401 (fixture)
from tests.tenants.factories import TenantFactory

schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application()).include(path_regex="/adapters/")


pytestmark = pytest.mark.usefixtures("keep_test_connection")


@pytest.fixture
def target(s3, tiny_base):
    tenant = TenantFactory(slug="fuzzed")
    adapter = services.adapter_create(tenant=tenant, name="fuzzed")
    upload, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "a.zip",
                                                                                          "size": 10}])
    _, key = tenant_services.api_key_create(tenant=tenant, name="fuzz", scopes=["manage"])
    return {"slug": tenant.slug, "name": adapter.name, "upload_id": str(upload.uuid)}, key


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_error_as_a_manage_key(case, target):
    call_pinned(case, *target)
