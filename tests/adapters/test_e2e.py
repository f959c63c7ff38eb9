"""The registry through the whole stack: the ASGI app under uvicorn, a real Celery worker, SeaweedFS. Adapters are
made for the model the worker validates against. Warm loading follows the stack: with no engines in it, versions
become ready without one (test_e2e_engine.py covers the engine)."""

import hashlib
import socket
import time

import httpx
import pytest

from adapters import selectors
from adapters.models import Adapter, AdapterVersion
from adapters.storage import staging_prefix
from tenants import services as tenant_services
from tests.adapters import archives
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import keys_under, leftovers
from tests.adapters.stack_client import Caller
from tests.tenants.factories import TenantFactory

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]


def _version(tenant, name: str, number: int) -> AdapterVersion:
    return AdapterVersion.objects.get(adapter__tenant=tenant, adapter__name=name, adapter__deleted_at__isnull=True,
                                      number=number)


def test_a_good_adapter_reaches_ready_through_both_upload_paths(stack, served_good_adapter, tmp_path):
    caller = Caller(stack, TenantFactory())
    caller.create("good")
    files = [served_good_adapter / CONFIG, served_good_adapter / WEIGHTS]
    zipped = archives.zip_folder(served_good_adapter, tmp_path / "adapter.zip", top="adapter")
    tarred = archives.tar_gz_folder(served_good_adapter, tmp_path / "adapter.tar.gz")
    ways = [("streamed files", caller.upload_streamed, files),
            ("streamed zip", caller.upload_streamed, [zipped]),
            ("presigned files", caller.upload_presigned, files),
            ("presigned tar.gz", caller.upload_presigned, [tarred])]
    for way, upload, paths in ways:
        response = upload("good", paths)
        assert response.status_code == 202, (way, response.text)
    results = caller.wait("good", [1, 2, 3, 4])
    sha256 = hashlib.sha256((served_good_adapter / WEIGHTS).read_bytes()).hexdigest()
    for number, (way, _, _) in enumerate(ways, start=1):
        body = results[number]
        assert body["status"] == "ready", (way, body["failure_code"], body["failure_reason"])
        assert (body["sha256"], body["rank"], body["target_modules"]) == (sha256, 8, ["q_proj", "v_proj"]), way
        assert (body["warm_loaded_at"] is not None) == bool(stack.engine_urls), way
        version = _version(caller.tenant, "good", number)
        assert keys_under(version.storage_prefix) == [version.storage_prefix + CONFIG,
                                                      version.storage_prefix + WEIGHTS], way
        assert keys_under(staging_prefix(version.upload.uuid)) == [], way
    served = selectors.adapter_resolve(tenant_id=caller.tenant.pk, ref="good")
    assert served.version == 4 and served.sha256 == sha256


def test_each_bad_input_fails_with_its_reason_and_leaves_nothing_stored(stack, served_cases):
    caller = Caller(stack, TenantFactory())
    caller.create("bad")
    numbers = {}
    for number, (case, expected) in enumerate(served_cases.items(), start=1):
        response = caller.upload_streamed("bad", list(expected.files))
        assert response.status_code == 202, (case, response.text)
        numbers[case] = number
    results = caller.wait("bad", list(numbers.values()))
    wrong = {}
    for case, number in numbers.items():
        body, expected = results[number], served_cases[case]
        if (body["status"], body["failure_code"]) != ("failed", expected.code) or \
                expected.reason not in body["failure_reason"]:
            wrong[case] = (body["status"], body["failure_code"], body["failure_reason"])
        elif leftovers(_version(caller.tenant, "bad", number)):
            wrong[case] = ("objects left", leftovers(_version(caller.tenant, "bad", number)))
    assert wrong == {}
    assert selectors.adapter_resolve(tenant_id=caller.tenant.pk, ref="bad") is None


def raw_upload_headers(stack, caller: Caller, name: str, length: int) -> bytes:
    host = stack.web_url.split("//")[1]
    return (f"POST {caller.base}{name}/versions/ HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {caller.key}\r\n"
            f"Content-Type: application/zip\r\nContent-Length: {length}\r\n\r\n").encode()


def test_an_oversize_upload_is_refused_before_its_bytes_in_both_paths(stack, served_good_adapter):
    caller = Caller(stack, TenantFactory())
    caller.create("big")
    tenant_services.quota_set(tenant=caller.tenant, changes={"max_adapter_storage_bytes": 100_000})
    host, port = stack.web_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(raw_upload_headers(stack, caller, "big", 50_000_000))  # the headers only, no body
        answer = b""
        while chunk := sock.recv(65536):  # the server answers and closes without waiting for the body
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"storage_quota_exceeded" in answer
    declared = caller.http.post(f"{caller.base}big/uploads/", json={"files": [{"name": "a.zip", "size": 100_001}]})
    assert declared.status_code == 413 and declared.json()["errors"][0]["code"] == "storage_quota_exceeded"
    # A declared size inside the quota cannot be exceeded either: the store takes exactly the signed length.
    small = caller.http.post(f"{caller.base}big/uploads/", json={"files": [{"name": "a.zip", "size": 1000}]}).json()
    assert httpx.put(small["targets"][0]["urls"][0], content=b"x" * 5000).status_code == 403
    assert keys_under(staging_prefix(small["upload"]["id"])) == []
    assert not AdapterVersion.objects.filter(adapter__tenant=caller.tenant).exists()


def test_an_outsider_can_neither_see_nor_use_nor_delete_an_adapter(stack, served_good_adapter):
    owner, outsider = Caller(stack, TenantFactory()), Caller(stack, TenantFactory())
    owner.create("private")
    assert owner.upload_streamed("private", [served_good_adapter / CONFIG, served_good_adapter / WEIGHTS]
                                 ).status_code == 202
    assert owner.wait("private", [1])[1]["status"] == "ready"
    theirs = f"/api/tenants/{owner.tenant.slug}/adapters/"
    for method, path in [("GET", theirs), ("GET", theirs + "private/"), ("GET", theirs + "private/versions/1/"),
                         ("DELETE", theirs + "private/versions/1/"), ("DELETE", theirs + "private/"),
                         ("POST", theirs + "private/uploads/")]:
        assert outsider.http.request(method, path, json={}).status_code == 404, (method, path)
    # Their own slug with the owner's adapter name: not found either; nor can a request of theirs resolve it.
    assert outsider.http.get(outsider.base + "private/").status_code == 404
    assert selectors.adapter_resolve(tenant_id=outsider.tenant.pk, ref="private") is None
    with socket.create_connection(tuple(stack.web_url.split("//")[1].split(":")), timeout=20) as sock:
        headers = raw_upload_headers(stack, owner, "private", 1000).replace(owner.key.encode(), outsider.key.encode())
        sock.sendall(headers)  # an upload into the owner's adapter: refused before the body
        assert sock.recv(65536).startswith(b"HTTP/1.1 404")
    version = _version(owner.tenant, "private", 1)
    assert version.deleted_at is None and len(keys_under(version.storage_prefix)) == 2
    assert selectors.adapter_resolve(tenant_id=owner.tenant.pk, ref="private").version == 1


def test_deleting_an_adapter_stops_it_at_once_and_purges_its_objects(stack, served_good_adapter):
    caller = Caller(stack, TenantFactory())
    caller.create("gone")
    for _ in range(2):
        assert caller.upload_streamed("gone", [served_good_adapter / CONFIG, served_good_adapter / WEIGHTS]
                                      ).status_code == 202
    assert {b["status"] for b in caller.wait("gone", [1, 2]).values()} == {"ready"}
    adapter = Adapter.objects.get(tenant=caller.tenant, name="gone")
    root = f"tenants/{caller.tenant.pk}/adapters/{adapter.uuid}/"
    assert len(keys_under(root)) == 4
    assert caller.http.delete(caller.base + "gone/").status_code == 204
    assert selectors.adapter_resolve(tenant_id=caller.tenant.pk, ref="gone") is None  # at once
    assert caller.http.get(caller.base + "gone/").status_code == 404
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and AdapterVersion.objects.filter(adapter=adapter, purged_at=None).exists():
        time.sleep(0.2)
    assert not AdapterVersion.objects.filter(adapter=adapter, purged_at=None).exists(), "the purge task did not run"
    assert keys_under(root) == []
    caller.create("gone")  # the name is free again
