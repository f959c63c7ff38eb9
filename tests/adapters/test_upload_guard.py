"""The ASGI app in-process (config.asgi.application): a streamed upload that may not proceed is answered from its
headers alone, and the body is never read; an admitted one goes through to the view."""

import asyncio

import pytest
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from adapters import services
from adapters.models import AdapterUpload, AdapterVersion
from config.asgi import application
from tenants import services as tenant_services
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the app runs views on its own thread and connection


def post(path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes, int]:
    """POST through the ASGI app; (status, headers, body, how many times the app called receive())."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }
    reads, sent = [0], []

    async def receive():
        reads[0] += 1
        if reads[0] == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # no disconnect: Django stops listening once it has answered

    async def send(message):
        sent.append(message)

    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    response_headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], response_headers, b"".join(m.get("body", b"") for m in sent[1:]), reads[0]


@pytest.fixture
def setting(s3, tiny_base, captured_tasks):
    tenant = TenantFactory()
    services.adapter_create(tenant=tenant, name="sql")
    _, key = tenant_services.api_key_create(tenant=tenant, name="ci", scopes=["manage"])
    return tenant, key


def upload_path(tenant) -> str:
    return f"/api/tenants/{tenant.slug}/adapters/sql/versions/"


def multipart(adapter_dir) -> bytes:
    with open(adapter_dir / CONFIG, "rb") as config, open(adapter_dir / WEIGHTS, "rb") as weights:
        return encode_multipart(BOUNDARY, {"files": [config, weights]})


def headers_for(key: str | None, length: int | None, content_type: str = MULTIPART_CONTENT) -> dict[str, str]:
    headers = {"content-type": content_type, "host": "testserver"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if length is not None:
        headers["content-length"] = str(length)
    return headers


def test_over_the_quota_is_413_before_a_byte_is_read(setting):
    tenant, key = setting
    tenant_services.quota_set(tenant=tenant, changes={"max_adapter_storage_bytes": 10_000})
    status, headers, body, reads = post(upload_path(tenant), headers_for(key, 10_001), b"")
    assert (status, reads) == (413, 0)
    assert b"storage_quota_exceeded" in body and headers["connection"] == "close"
    assert not AdapterUpload.objects.exists()


@pytest.mark.parametrize(("who", "length", "content_type", "status"), [
    ("anonymous", 100, MULTIPART_CONTENT, 401),
    ("inference key", 100, MULTIPART_CONTENT, 403),
    ("other tenant's manage key", 100, MULTIPART_CONTENT, 404),
    ("manage key", None, MULTIPART_CONTENT, 411),
    ("manage key", 100, "application/json", 415),
])
def test_refusals_from_the_headers_never_read_the_body(setting, who, length, content_type, status):
    tenant, key = setting
    if who == "inference key":
        key = tenant_services.api_key_create(tenant=tenant, name="inf", scopes=["inference"])[1]
    elif who == "other tenant's manage key":
        key = tenant_services.api_key_create(tenant=TenantFactory(), name="o", scopes=["manage"])[1]
    elif who == "anonymous":
        key = None
    assert post(upload_path(tenant), headers_for(key, length, content_type), b"")[0::3] == (status, 0)


def test_an_admitted_upload_is_read_and_becomes_a_version(setting, tiny_good_adapter, captured_tasks):
    tenant, key = setting
    body = multipart(tiny_good_adapter)
    status, _, response, reads = post(upload_path(tenant), headers_for(key, len(body)), body)
    assert status == 202 and reads >= 1, response
    version = AdapterVersion.objects.get(adapter__tenant=tenant)
    assert captured_tasks == [("adapter_version_validate", (version.pk,))]  # enqueued once committed
    assert version.number == 1 and version.upload_bytes == sum(
        (tiny_good_adapter / n).stat().st_size for n in (CONFIG, WEIGHTS))


def test_other_routes_are_not_guarded(setting):
    tenant, key = setting
    status, _, _, reads = post(f"/api/tenants/{tenant.slug}/adapters/", headers_for(key, 2, "application/json"),
                               b"{}")
    assert status == 400 and reads >= 1  # the plain view read the body and found no name
