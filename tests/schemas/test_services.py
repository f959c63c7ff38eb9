"""The registry's writes and the warm compile, in-process on the real database; engines are scripted
(httpx.MockTransport) to answer as ENGINE_PROTOCOL's compile endpoint does. The real engines: test_e2e_engine.py."""

import json

import httpx
import pytest
from django.core.exceptions import ValidationError

from adapters import engine_client
from adapters.errors import QuotaExceeded, TransientFailure
from schemas import compiling, selectors, services
from schemas.models import Schema, SchemaVersion
from tenants.engine_tags import cache_salt
from tests.schemas.conftest import INVOICE

COMPILED = (200, {"object": "structured_outputs.compiled", "kind": "json", "cached": False, "compile_ms": 4.5})
REFUSED = (400, {"error": {"message": "structured_outputs.json: unsupported JSON Schema keyword 'dependentSchemas'",
                           "type": "invalid_request_error", "param": "structured_outputs.json",
                           "code": "invalid_request"}})


class Engines:
    """Engines by host answering the compile endpoint with (status, body), or down (None)."""

    def __init__(self, answers: dict[str, tuple | None]):
        self.answers, self.calls = answers, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.url.host, request.url.path, json.loads(request.content),
                           request.headers["authorization"]))
        answer = self.answers[request.url.host]
        if answer is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(answer[0], json=answer[1])


@pytest.fixture
def engines(settings, monkeypatch):
    """Scripted engines as settings.ENGINE_URLS: ``engines({"e1": COMPILED, "e2": None})``."""

    def make(answers: dict[str, tuple | None]) -> Engines:
        scripted = Engines(answers)
        settings.ENGINE_URLS = [f"http://{host}:8100" for host in answers]
        settings.ENGINE_API_KEY = "engine-secret"
        real = engine_client.compile_everywhere
        monkeypatch.setattr(compiling, "compile_everywhere",
                            lambda *a, **kw: real(*a, **kw, transport=httpx.MockTransport(scripted)))
        return scripted

    return make


def test_create_saves_version_1_pending_and_queues_its_compile_on_commit(cast, queued_compiles,
                                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        version = services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE,
                                         description="an invoice", strict=True, created_by=cast.owner)
    assert (version.number, version.status, version.strict, version.document) == (1, "pending", True, INVOICE)
    assert queued_compiles == [version.pk]
    with django_capture_on_commit_callbacks(execute=True):
        second = services.schema_version_add(tenant=cast.tenant, schema=version.schema, document={"type": "object"})
    assert second.number == 2 and queued_compiles == [version.pk, second.pk]


def test_names_are_unique_per_tenant_follow_openais_rule_and_are_free_again_after_delete(cast, queued_compiles):
    services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE)
    services.schema_create(tenant=cast.other_tenant, name="invoice", document=INVOICE)  # another tenant's own
    with pytest.raises(ValidationError, match="exists"):
        services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE)
    for bad in ("in voice", "invoice@2", "x" * 65, "", "naïve"):
        with pytest.raises(ValidationError) as caught:
            services.schema_create(tenant=cast.tenant, name=bad, document=INVOICE)
        assert "name" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        services.schema_create(tenant=cast.tenant, name="broken", document={"type": 7})
    assert "schema" in caught.value.message_dict and not Schema.objects.filter(name="broken").exists()
    services.schema_delete(tenant=cast.tenant, schema=selectors.schema_get(tenant=cast.tenant, name="invoice"))
    assert not SchemaVersion.objects.filter(schema__tenant=cast.tenant).exists()
    assert selectors.schema_get(tenant=cast.other_tenant, name="invoice").num_versions == 1
    assert services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE).number == 1


def test_version_numbers_are_never_reused_and_the_count_is_bounded(cast, queued_compiles, monkeypatch):
    first = services.schema_create(tenant=cast.tenant, name="a", document=INVOICE)
    numbers = [services.schema_version_add(tenant=cast.tenant, schema=first.schema, document=INVOICE).number
               for _ in range(2)]
    assert numbers == [2, 3]
    monkeypatch.setattr(services, "MAX_SCHEMAS_PER_TENANT", 1)
    with pytest.raises(QuotaExceeded) as caught:
        services.schema_create(tenant=cast.tenant, name="b", document=INVOICE)
    assert (caught.value.status, caught.value.code) == (409, "schema_quota_exceeded")


def test_a_compile_asks_every_engine_with_the_tenants_salt_and_ends_ready(cast, queued_compiles, engines):
    scripted = engines({"e1": COMPILED, "e2": (200, {**COMPILED[1], "compile_ms": 9.0, "cached": True})})
    version = services.schema_create(tenant=cast.tenant, name="invoice", document=INVOICE)
    assert compiling.schema_version_compile(version_id=version.pk) == "ready"
    body = {"structured_outputs": {"json": INVOICE}, "cache_salt": cache_salt(cast.tenant.pk)}
    assert scripted.calls == [(host, "/v1/structured_outputs/compile", body, "Bearer engine-secret")
                              for host in ("e1", "e2")]
    version.refresh_from_db()
    assert (version.status, version.warm_replicas, version.compile_ms) == ("ready", 2, 9.0)
    assert version.compiled_at is not None
    assert compiling.schema_version_compile(version_id=version.pk) is None  # settled: nothing to do
    assert len(scripted.calls) == 2


def test_an_engines_refusal_fails_the_version_with_its_words(cast, queued_compiles, engines):
    engines({"e1": COMPILED, "e2": REFUSED})
    version = services.schema_create(tenant=cast.tenant, name="dep", document={"dependentSchemas": {}})
    assert compiling.schema_version_compile(version_id=version.pk) == "failed"
    version.refresh_from_db()
    assert version.failure_code == "invalid_request"
    assert version.failure_reason == REFUSED[1]["error"]["message"]  # the engine's words, no URL or status


def test_engines_down_retry_then_a_last_attempt_fails_and_one_up_is_enough(cast, queued_compiles, engines):
    engines({"e1": None, "e2": (503, {"error": {"message": "overloaded", "code": "overloaded"}})})
    version = services.schema_create(tenant=cast.tenant, name="later", document=INVOICE)
    with pytest.raises(TransientFailure):
        compiling.schema_version_compile(version_id=version.pk, final_attempt=False)
    assert SchemaVersion.objects.get(pk=version.pk).status == "pending"
    assert compiling.schema_version_compile(version_id=version.pk, final_attempt=True) == "failed"
    assert SchemaVersion.objects.get(pk=version.pk).failure_code == "engine_unreachable"
    engines({"e1": None, "e2": COMPILED})
    other = services.schema_create(tenant=cast.tenant, name="half", document=INVOICE)
    assert compiling.schema_version_compile(version_id=other.pk, final_attempt=False) == "ready"
    assert SchemaVersion.objects.get(pk=other.pk).warm_replicas == 1


def test_without_engines_a_version_is_ready_uncompiled(cast, queued_compiles, settings):
    settings.ENGINE_URLS = []
    version = services.schema_create(tenant=cast.tenant, name="solo", document=INVOICE)
    assert compiling.schema_version_compile(version_id=version.pk) == "ready"
    version.refresh_from_db()
    assert (version.warm_replicas, version.compiled_at) == (0, None)


def test_the_sweep_queues_again_what_lost_its_task(cast, queued_compiles):
    from django.utils import timezone

    stale = services.schema_create(tenant=cast.tenant, name="stale", document=INVOICE)
    fresh = services.schema_create(tenant=cast.tenant, name="fresh", document=INVOICE)
    SchemaVersion.objects.filter(pk=stale.pk).update(created_at=timezone.now() - compiling.STALE_COMPILE * 2)
    queued_compiles.clear()
    assert compiling.schema_versions_recompile_stale() == 1
    assert queued_compiles == [stale.pk] and fresh.pk not in queued_compiles
