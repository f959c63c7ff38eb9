"""The gateway's resolution of a registered schema by name (gateway.named_schemas), in-process on the real
database through the gateway's database thread: which version a name serves, pinning, and the 400s."""

import asyncio

import pytest

from gateway.errors import GatewayError
from gateway.named_schemas import inline_registered_schema
from schemas import services
from schemas.models import SchemaVersion
from tenants.db_thread import close_db_thread_connection
from tests.schemas.conftest import INVOICE

pytestmark = pytest.mark.django_db(transaction=True)  # the gateway's database thread reads committed rows
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def _close_gateway_db_thread():
    yield
    close_db_thread_connection()


def named(name, **extra) -> dict:
    return {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": name, **extra}}}


def resolve(tenant, body: dict) -> dict:
    return asyncio.run(inline_registered_schema(tenant.pk, body))


def refused(tenant, body: dict) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        resolve(tenant, body)
    assert caught.value.status == 400
    return caught.value


def versions(tenant, name: str, *statuses: str) -> list[SchemaVersion]:
    """Versions 1.. of ``name`` with these statuses; version N's document has ``"title": "vN"``."""
    made = [services.schema_create(tenant=tenant, name=name, document={**INVOICE, "title": "v1"}, strict=True,
                                   description="an invoice")]
    for number in range(2, len(statuses) + 1):
        made.append(services.schema_version_add(tenant=tenant, schema=made[0].schema,
                                                document={**INVOICE, "title": f"v{number}"}))
    for version, status in zip(made, statuses, strict=True):
        SchemaVersion.objects.filter(pk=version.pk).update(status=status, failure_reason="engine said no")
    return made


def served_title(tenant, body: dict) -> str:
    return resolve(tenant, body)["response_format"]["json_schema"]["schema"]["title"]


def test_a_name_serves_its_newest_ready_version_else_its_newest_pending_one(cast, queued_compiles):
    versions(cast.tenant, "invoice", "ready", "ready", "pending", "failed")
    assert served_title(cast.tenant, named("invoice")) == "v2"
    versions(cast.tenant, "draft", "failed", "pending")
    assert served_title(cast.tenant, named("draft")) == "v2"  # the engine compiles it in the request


def test_the_resolved_format_is_the_inline_one_with_the_registered_strict_and_description(cast, queued_compiles):
    versions(cast.tenant, "invoice", "ready")
    resolved = resolve(cast.tenant, named("invoice"))
    assert resolved == {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "invoice", "schema": {**INVOICE, "title": "v1"}, "strict": True, "description": "an invoice"}}}
    own = resolve(cast.tenant, named("invoice", strict=False, description="mine"))["response_format"]["json_schema"]
    assert (own["strict"], own["description"]) == (False, "mine")


def test_a_version_field_pins_any_version_that_did_not_fail(cast, queued_compiles):
    versions(cast.tenant, "invoice", "ready", "pending", "failed")
    assert served_title(cast.tenant, named("invoice", version=1)) == "v1"
    assert served_title(cast.tenant, named("invoice", version=2)) == "v2"
    assert "version" not in resolve(cast.tenant, named("invoice", version=2))["response_format"]["json_schema"]
    failed = refused(cast.tenant, named("invoice", version=3))
    assert (failed.code, failed.param) == ("schema_failed", "response_format.json_schema.version")
    assert "Version 3 of the schema 'invoice' failed to compile on the engines: engine said no" in failed.message
    missing = refused(cast.tenant, named("invoice", version=9))
    assert (missing.code, missing.param) == ("schema_not_found", "response_format.json_schema.version")


def test_a_name_whose_versions_all_failed_is_refused_with_the_reason(cast, queued_compiles):
    versions(cast.tenant, "broken", "failed", "failed")
    error = refused(cast.tenant, named("broken"))
    assert (error.code, error.param) == ("schema_failed", "response_format.json_schema.name")
    assert "Version 2" in error.message and "engine said no" in error.message


def test_names_resolve_in_the_callers_tenant_only(cast, queued_compiles):
    versions(cast.other_tenant, "theirs", "ready")
    foreign, unknown = refused(cast.tenant, named("theirs")), refused(cast.tenant, named("nothing"))
    assert (foreign.code, foreign.param) == ("schema_not_found", "response_format.json_schema.name")
    assert foreign.message.replace("theirs", "N") == unknown.message.replace("nothing", "N")
    assert served_title(cast.other_tenant, named("theirs")) == "v1"


def test_inline_schemas_and_other_formats_pass_unchanged(cast, queued_compiles):
    versions(cast.tenant, "invoice", "ready")
    inline = named("invoice", schema={"type": "object"})
    assert resolve(cast.tenant, inline) is inline  # an inline schema wins, even over a registered name
    for body in (CHAT, {**CHAT, "response_format": {"type": "json_object"}},
                 {**CHAT, "response_format": {"type": "json_schema"}}, {**CHAT, "response_format": "text"}):
        assert resolve(cast.tenant, body) is body  # the contract judges these


@pytest.mark.parametrize("spec, param", [
    ({"name": "invoice", "schema": {"type": "object"}, "version": 1}, "version"),
    ({"name": "in voice"}, "name"), ({"name": ""}, "name"), ({"name": 7}, "name"), ({}, "name"),
    ({"name": "x" * 65}, "name"), ({"name": "invoice", "version": True}, "version"),
    ({"name": "invoice", "version": 0}, "version"), ({"name": "invoice", "version": "1"}, "version"),
    ({"name": "invoice", "version": 2**40}, "version"),
])
def test_malformed_names_and_versions_are_refused_by_field(cast, spec, param):
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": spec}}
    assert refused(cast.tenant, body).param == f"response_format.json_schema.{param}"
