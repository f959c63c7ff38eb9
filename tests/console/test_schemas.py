"""Schemas in the console: the list, a schema's page (versions with their compile status and reasons, the
document, polling while one is pending), registering, adding a version, deleting, and who sees which controls.
The same pages in a real browser against the whole stack: test_browser_schemas.py."""

import json

import pytest
from django.urls import reverse

from schemas import services
from schemas.models import Schema, SchemaVersion
from tests.schemas.conftest import INVOICE, queued_compiles  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def invoice(cast, queued_compiles):  # noqa: F811
    """invoice: v1 ready, v2 failed with the engine's reason. Another tenant's schema beside it."""
    v1 = services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE, created_by=cast.owner)
    v2 = services.schema_version_add(tenant=cast.tenant, schema=v1.schema, document={"dependentSchemas": {}})
    SchemaVersion.objects.filter(pk=v1.pk).update(status="ready", warm_replicas=2, compile_ms=4.5,
                                                  compiled_at=v1.created_at)
    SchemaVersion.objects.filter(pk=v2.pk).update(status="failed", failure_code="invalid_request",
                                                  failure_reason="unsupported keyword 'dependentSchemas'")
    services.schema_create(tenant=cast.other_tenant, name="secret-schema", document=INVOICE)
    return v1.schema


def url(name: str, *args) -> str:
    return reverse(f"console:{name}", args=args)


def test_the_list_and_a_schemas_page_show_versions_status_and_reasons(cast, client_as, invoice):
    listing = client_as("teammate").get(url("tenant-schemas", cast.tenant.slug)).content.decode()
    assert 'id="schema-invoice"' in listing and "version 1" in listing and "secret-schema" not in listing
    assert 'id="schema-create"' not in listing  # members read only
    page = client_as("teammate").get(url("tenant-schema", cast.tenant.slug, "invoice")).content.decode()
    assert 'data-testid="serving-version">version 1<' in page
    assert "on 2 engines" in page and "(4.5 ms)" in page
    assert "Version 2 failed to compile:</strong> unsupported keyword &#x27;dependentSchemas&#x27;" in page
    assert "&quot;currency&quot;" in page  # the document, pretty-printed
    assert "hx-trigger" not in page.split('id="schema-live"')[1].split(">")[0]  # nothing pending: no polling
    assert 'id="version-add"' not in page and "Delete schema" not in page


def test_outsiders_get_404_and_members_cannot_write(cast, client_as, invoice):
    outsider = client_as("outsider")
    assert outsider.get(url("tenant-schemas", cast.tenant.slug)).status_code == 404
    assert outsider.get(url("tenant-schema", cast.tenant.slug, "invoice")).status_code == 404
    assert client_as("owner").get(url("tenant-schema", cast.tenant.slug, "secret-schema")).status_code == 404
    teammate = client_as("teammate")
    assert teammate.post(url("tenant-schemas", cast.tenant.slug), {"name": "x", "schema": "{}"}).status_code == 403
    assert teammate.post(url("tenant-schema-delete", cast.tenant.slug, "invoice")).status_code == 403
    assert Schema.objects.filter(tenant=cast.tenant).count() == 1


def test_admins_register_add_versions_and_delete(cast, client_as, queued_compiles):  # noqa: F811
    owner = client_as("owner")
    created = owner.post(url("tenant-schemas", cast.tenant.slug),
                         {"name": "invoice", "schema": json.dumps(INVOICE), "description": "bills", "strict": "on"})
    assert created.status_code == 303 and created["Location"] == url("tenant-schema", cast.tenant.slug, "invoice")
    v1 = SchemaVersion.objects.get(schema__tenant=cast.tenant, schema__name="invoice")
    assert (v1.document, v1.strict, v1.description, v1.created_by) == (INVOICE, True, "bills", cast.owner)
    page = owner.get(created["Location"]).content.decode()
    assert 'data-testid="serving-pending"' in page and 'hx-trigger="every 1s"' in page
    added = owner.post(created["Location"], {"schema": '{"type": "object"}'})
    assert added.status_code == 303
    assert list(SchemaVersion.objects.filter(schema=v1.schema).values_list("number", flat=True)) == [2, 1]
    deleted = owner.post(url("tenant-schema-delete", cast.tenant.slug, "invoice"), HTTP_HX_REQUEST="true")
    assert deleted.status_code == 204 and deleted["HX-Redirect"] == url("tenant-schemas", cast.tenant.slug)
    assert not Schema.objects.filter(tenant=cast.tenant).exists()


@pytest.mark.parametrize("fields, words", [
    ({"name": "in voice", "schema": "{}"}, "OpenAI"),
    ({"name": "a", "schema": "{not json"}, "Not valid JSON"),
    ({"name": "a", "schema": '{"type": "integer2"}'}, "Not a valid JSON Schema at schema.type"),
    ({"name": "a", "schema": "[]"}, "must be a JSON object"),
])
def test_bad_input_is_shown_on_the_form(cast, client_as, fields, words):
    response = client_as("owner").post(url("tenant-schemas", cast.tenant.slug), fields)
    assert response.status_code == 200 and words in response.content.decode()
    assert not Schema.objects.filter(tenant=cast.tenant).exists()
