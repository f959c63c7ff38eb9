"""The adapter API in-process (DRF test client, real database and S3): every endpoint with owner, teammate,
outsider, operator, a manage key, an inference key and anonymous; then what the endpoints do."""

from datetime import timedelta

import pytest
from django.utils import timezone

from adapters import services
from adapters.models import AdapterUpload, AdapterVersion
from adapters.staging import MAX_FILES
from adapters.storage import staging_prefix
from tenants import services as tenant_services
from tests.adapters import archives
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import keys_under, presigned_upload, put_targets

CALLERS = ("owner", "teammate", "outsider", "operator", "manage_key")
A = "/api/tenants/{slug}/adapters/"
T = A + "target/"

# (method, path, body kind, expected status for each of CALLERS); bodies are built by `_body`.
ENDPOINTS = [
    ("get", A, None, (200, 200, 404, 200, 200)),
    ("post", A, "create", (201, 403, 404, 201, 201)),
    ("get", T, None, (200, 200, 404, 200, 200)),
    ("patch", T, "describe", (200, 403, 404, 200, 200)),
    ("delete", T, None, (204, 403, 404, 204, 204)),
    ("get", T + "versions/", None, (200, 200, 404, 200, 200)),
    ("post", T + "versions/", "files", (202, 403, 404, 202, 202)),
    ("get", T + "versions/1/", None, (200, 200, 404, 200, 200)),
    ("delete", T + "versions/1/", None, (204, 403, 404, 204, 204)),
    ("post", T + "uploads/", "declare", (201, 403, 404, 201, 201)),
    ("get", T + "uploads/{upload}/", None, (200, 200, 404, 200, 200)),
    ("post", T + "uploads/{upload}/complete/", None, (409, 403, 404, 409, 409)),  # nothing was PUT
    ("delete", T + "uploads/{upload}/", None, (204, 403, 404, 204, 204)),
]
IDS = [f"{m.upper()} {p.replace(A, '.../adapters/')}" for m, p, _, _ in ENDPOINTS]


@pytest.fixture
def targets(cast, s3, tiny_base, tiny_good_adapter):
    """An adapter `target` of cast.tenant with a ready version 1 and a pending direct upload."""
    adapter = services.adapter_create(tenant=cast.tenant, name="target")
    version = presigned_upload(cast.tenant, adapter, [tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS])
    services.adapter_version_validate(version_id=version.pk)
    upload, _ = services.upload_create_presigned(tenant=cast.tenant, adapter=adapter,
                                                 files=[{"name": "a.zip", "size": 10}])
    return {"slug": cast.tenant.slug, "upload": upload.uuid, "adapter": adapter}


def _body(kind, adapter_dir):
    if kind == "create":
        return {"name": "fresh"}, "json"
    if kind == "describe":
        return {"description": "new words"}, "json"
    if kind == "declare":
        return {"files": [{"name": CONFIG, "size": 10}, {"name": WEIGHTS, "size": 20}]}, "json"
    if kind == "files":
        return {"files": [open(adapter_dir / CONFIG, "rb"), open(adapter_dir / WEIGHTS, "rb")]}, "multipart"
    return None, "json"


def _call(client, method, path, kind, targets, adapter_dir):
    body, fmt = _body(kind, adapter_dir)
    return getattr(client, method)(path.format(**targets), body, format=fmt)


@pytest.mark.parametrize("caller_index", range(len(CALLERS)), ids=CALLERS)
@pytest.mark.parametrize(("method", "path", "kind", "expected"), ENDPOINTS, ids=IDS)
def test_each_caller_gets_its_status(client_for, targets, tiny_good_adapter, method, path, kind, expected,
                                     caller_index):
    response = _call(client_for(CALLERS[caller_index]), method, path, kind, targets, tiny_good_adapter)
    assert response.status_code == expected[caller_index], response.content[:300]


@pytest.mark.parametrize(("method", "path", "kind", "expected"), ENDPOINTS, ids=IDS)
def test_anonymous_is_401_and_inference_key_is_403(client_for, targets, tiny_good_adapter, method, path, kind,
                                                   expected):
    assert _call(client_for("anonymous"), method, path, kind, targets, tiny_good_adapter).status_code == 401
    response = _call(client_for("inference_key"), method, path, kind, targets, tiny_good_adapter)
    assert response.status_code == 403
    assert "manage" in response.json()["errors"][0]["detail"]


def test_the_outsider_changed_nothing(client_for, targets, tiny_good_adapter):
    for method, path, kind, _ in ENDPOINTS:
        _call(client_for("outsider"), method, path, kind, targets, tiny_good_adapter)
    adapter = targets["adapter"]
    adapter.refresh_from_db()
    assert adapter.deleted_at is None and adapter.description == ""
    assert list(adapter.versions.values_list("number", "deleted_at")) == [(1, None)]
    assert AdapterUpload.objects.filter(adapter=adapter).count() == 2  # nothing declared by the outsider


def test_another_tenants_adapter_is_404_even_under_the_callers_own_slug(client_for, cast, targets):
    services.adapter_create(tenant=cast.other_tenant, name="theirs")
    mine = client_for("owner")
    assert mine.get(f"/api/tenants/{cast.tenant.slug}/adapters/theirs/").status_code == 404
    assert mine.delete(f"/api/tenants/{cast.tenant.slug}/adapters/theirs/").status_code == 404
    outsider = client_for("outsider")
    theirs = outsider.get(f"/api/tenants/{cast.other_tenant.slug}/adapters/").json()
    assert [a["name"] for a in theirs["results"]] == ["theirs"]  # their own only
    path = f"/api/tenants/{cast.other_tenant.slug}/adapters/theirs/uploads/{targets['upload']}/"
    assert outsider.get(path).status_code == 404  # an upload id of cast.tenant under their own adapter


# ---------------------------------------------------------------- behaviour


@pytest.fixture
def owner(client_for, cast, s3, tiny_base):
    client = client_for("owner")
    assert client.post(f"/api/tenants/{cast.tenant.slug}/adapters/", {"name": "sql", "description": "d"},
                       format="json").status_code == 201
    return client


def versions_path(cast) -> str:
    return f"/api/tenants/{cast.tenant.slug}/adapters/sql/versions/"


def test_a_streamed_multipart_upload_makes_a_version_that_validates(owner, cast, tiny_good_adapter):
    with open(tiny_good_adapter / CONFIG, "rb") as config, open(tiny_good_adapter / WEIGHTS, "rb") as weights:
        response = owner.post(versions_path(cast), {"files": [config, weights]}, format="multipart")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["version"], body["status"], body["failure_code"]) == (1, "uploaded", "")
    version = AdapterVersion.objects.get(adapter__tenant=cast.tenant, number=1)
    staged = keys_under(staging_prefix(version.upload.uuid))
    assert len(staged) == 2 and [f["name"] for f in version.upload.files] == [CONFIG, WEIGHTS]
    services.adapter_version_validate(version_id=version.pk)
    detail = owner.get(versions_path(cast) + "1/").json()
    assert (detail["status"], detail["rank"], detail["target_modules"]) == ("ready", 8, ["q_proj", "v_proj"])
    assert owner.get(f"/api/tenants/{cast.tenant.slug}/adapters/sql/").json()["latest_version"] == 1


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_raw_archive_body_is_an_upload(owner, cast, tiny_good_adapter, tmp_path, kind):
    maker = archives.zip_folder if kind == "zip" else archives.tar_gz_folder
    archive = maker(tiny_good_adapter, tmp_path / f"a.{kind}")
    media = "application/zip" if kind == "zip" else "application/gzip"
    response = owner.generic("POST", versions_path(cast), archive.read_bytes(), content_type=media)
    assert response.status_code == 202, response.content
    version = AdapterVersion.objects.get(adapter__tenant=cast.tenant, number=1)
    assert version.upload.files[0]["name"] == f"upload.{kind}" and version.upload_bytes == archive.stat().st_size
    services.adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == "ready", version.failure_reason


def _error(response) -> tuple[int, str]:
    return response.status_code, response.json()["errors"][0]["code"]


def test_an_upload_over_the_quota_is_refused_from_its_content_length(owner, cast, tiny_good_adapter):
    tenant_services.quota_set(tenant=cast.tenant, changes={"max_adapter_storage_bytes": 1000})
    with open(tiny_good_adapter / WEIGHTS, "rb") as weights:
        response = owner.post(versions_path(cast), {"files": [weights]}, format="multipart")
    assert _error(response) == (413, "storage_quota_exceeded")
    assert "only 1000 of the tenant's 1000 bytes" in response.json()["errors"][0]["detail"]
    assert not AdapterUpload.objects.filter(tenant=cast.tenant).exists()


def test_an_upload_over_the_platform_limit_is_refused(settings, owner, cast):
    settings.ADAPTER_MAX_UPLOAD_BYTES = 1024
    response = owner.generic("POST", versions_path(cast), b"x" * 1025, content_type="application/zip")
    assert _error(response) == (413, "upload_too_large")


def test_a_streamed_upload_needs_a_length_and_a_known_media_type(owner, cast):
    response = owner.generic("POST", versions_path(cast), b"PK\x03\x04", content_type="application/zip",
                             CONTENT_LENGTH="")
    assert _error(response) == (411, "length_required")
    assert _error(owner.post(versions_path(cast), {"files": []}, format="json"))[0] == 415
    assert not AdapterUpload.objects.filter(tenant=cast.tenant).exists()


def test_too_many_files_are_refused_and_what_was_staged_is_removed(owner, cast, tmp_path):
    paths = []
    for i in range(MAX_FILES + 1):
        paths.append(tmp_path / f"f{i}.txt")
        paths[-1].write_bytes(b"x" * 100)
    response = owner.post(versions_path(cast), {"files": [open(p, "rb") for p in paths]}, format="multipart")
    assert response.status_code == 400 and f"at most {MAX_FILES} files" in response.json()["errors"][0]["detail"]
    upload = AdapterUpload.objects.get(tenant=cast.tenant)
    assert upload.status == "aborted" and keys_under(staging_prefix(upload.uuid)) == []


def test_a_direct_upload_through_the_api(owner, cast, tiny_good_adapter):
    paths = [tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS]
    files = [{"name": p.name, "size": p.stat().st_size} for p in paths]
    uploads = f"/api/tenants/{cast.tenant.slug}/adapters/sql/uploads/"
    created = owner.post(uploads, {"files": files}, format="json")
    assert created.status_code == 201, created.content
    upload_id, targets = created.json()["upload"]["id"], created.json()["targets"]
    assert [t["part_sizes"] for t in targets] == [[f["size"]] for f in files]
    assert _error(owner.post(f"{uploads}{upload_id}/complete/")) == (409, "upload_incomplete")
    put_targets(targets, paths)
    completed = owner.post(f"{uploads}{upload_id}/complete/")
    assert completed.status_code == 202 and completed.json()["status"] == "uploaded"
    state = owner.get(f"{uploads}{upload_id}/").json()
    declared = sum(f["size"] for f in files)
    assert (state["status"], state["version"], state["declared_bytes"]) == ("completed", 1, declared)
    assert _error(owner.post(f"{uploads}{upload_id}/complete/")) == (409, "upload_completed")  # only once


def _upload_in(state: str, owner, cast, adapter_dir) -> str:
    """The id of an upload of adapter `sql` in ``state``, reached the way clients (or the sweep) reach it."""
    adapter = cast.tenant.adapters.get(name="sql")
    uploads = f"/api/tenants/{cast.tenant.slug}/adapters/sql/uploads/"
    kind, _, step = state.partition(" ")
    if kind == "streamed":
        if step == "completed":
            with open(adapter_dir / CONFIG, "rb") as config, open(adapter_dir / WEIGHTS, "rb") as weights:
                response = owner.post(versions_path(cast), {"files": [config, weights]}, format="multipart")
            assert response.status_code == 202, response.content
            return str(AdapterUpload.objects.get(adapter=adapter).uuid)
        upload = services.upload_begin_streamed(tenant=cast.tenant, adapter=adapter, num_bytes=10)  # in flight
        if step == "aborted":
            services.upload_abort(tenant=cast.tenant, upload=upload)
        return str(upload.uuid)
    paths = [adapter_dir / CONFIG, adapter_dir / WEIGHTS]
    created = owner.post(uploads, {"files": [{"name": p.name, "size": p.stat().st_size} for p in paths]},
                         format="json").json()
    upload_id = created["upload"]["id"]
    if step == "completed":
        put_targets(created["targets"], paths)
        assert owner.post(f"{uploads}{upload_id}/complete/").status_code == 202
    elif step == "aborted":
        assert owner.delete(f"{uploads}{upload_id}/").status_code == 204
    elif step.startswith("expired"):
        AdapterUpload.objects.filter(uuid=upload_id).update(expires_at=timezone.now() - timedelta(seconds=1))
        if step == "expired-swept":
            assert services.uploads_expire() == 1
    return upload_id


# (state, complete's 409 code, DELETE's answer, complete's code after that DELETE)
CLOSING = [
    ("presigned pending", "upload_incomplete", 204, "upload_aborted"),
    ("presigned completed", "upload_completed", "upload_completed", "upload_completed"),
    ("presigned aborted", "upload_aborted", 204, "upload_aborted"),
    ("presigned expired", "upload_expired", 204, "upload_expired"),
    ("presigned expired-swept", "upload_expired", 204, "upload_expired"),
    ("streamed pending", "upload_streaming", 204, "upload_aborted"),
    ("streamed completed", "upload_completed", "upload_completed", "upload_completed"),
    ("streamed aborted", "upload_aborted", 204, "upload_aborted"),
]
DETAILS = {"upload_incomplete": "adapter_config.json has not been uploaded.",
           "upload_completed": "The upload is already completed as version 1",
           "upload_aborted": "The upload was aborted; start a new one.",
           "upload_expired": "The upload has expired; start a new one.",
           "upload_streaming": "The upload is being streamed"}


@pytest.mark.parametrize(("state", "on_complete", "on_delete", "then_on_complete"), CLOSING,
                         ids=[state for state, *_ in CLOSING])
def test_completing_or_aborting_says_what_became_of_the_upload(owner, cast, tiny_good_adapter, state, on_complete,
                                                               on_delete, then_on_complete):
    upload_id = _upload_in(state, owner, cast, tiny_good_adapter)
    path = f"/api/tenants/{cast.tenant.slug}/adapters/sql/uploads/{upload_id}/"

    def check(response, code):
        assert _error(response) == (409, code), response.content
        assert response.json()["errors"][0]["detail"].startswith(DETAILS[code])

    check(owner.post(path + "complete/"), on_complete)
    deleted = owner.delete(path)
    if on_delete == 204:
        assert deleted.status_code == 204, deleted.content
    else:
        check(deleted, on_delete)
        assert "delete the version instead" in deleted.json()["errors"][0]["detail"]
    check(owner.post(path + "complete/"), then_on_complete)
    assert AdapterVersion.objects.filter(adapter__tenant=cast.tenant).count() == ("completed" in state)


def test_adapter_count_quota_answers_409(owner, cast):
    tenant_services.quota_set(tenant=cast.tenant, changes={"max_adapters": 1})
    response = owner.post(f"/api/tenants/{cast.tenant.slug}/adapters/", {"name": "second"}, format="json")
    assert _error(response) == (409, "adapter_quota_exceeded")


def test_versions_list_filters_by_status(owner, cast, tiny_good_adapter, tiny_cases):
    adapter = cast.tenant.adapters.get(name="sql")
    for files in ([tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS], list(tiny_cases["truncated"].files)):
        services.adapter_version_validate(version_id=presigned_upload(cast.tenant, adapter, files).pk)
    failed = owner.get(versions_path(cast) + "?status=failed").json()["results"]
    assert [(v["version"], v["failure_code"]) for v in failed] == [(2, "truncated")]
    assert [v["version"] for v in owner.get(versions_path(cast)).json()["results"]] == [2, 1]


CSRF = "s" * 32  # a well-formed CSRF secret, sent as cookie and header alike


@pytest.mark.parametrize(("token_in", "status"), [("header", 202), ("form", 403), ("nowhere", 403)])
def test_a_session_upload_carries_its_csrf_token_in_the_header(cast, s3, tiny_base, tiny_good_adapter, token_in,
                                                               status):
    from django.test import Client

    services.adapter_create(tenant=cast.tenant, name="sql")
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.owner)
    client.cookies["csrftoken"] = CSRF
    with open(tiny_good_adapter / CONFIG, "rb") as config, open(tiny_good_adapter / WEIGHTS, "rb") as weights:
        data = {"files": [config, weights], **({"csrfmiddlewaretoken": CSRF} if token_in == "form" else {})}
        headers = {"HTTP_X_CSRFTOKEN": CSRF} if token_in == "header" else {}
        response = client.post(versions_path(cast), data, **headers)
    assert response.status_code == status, response.content[:300]
    if status == 403:  # the check never parsed the body, so nothing was staged or reserved
        assert "CSRF" in response.json()["errors"][0]["detail"]
        assert not AdapterUpload.objects.filter(tenant=cast.tenant).exists()


def test_the_adapter_api_is_in_the_openapi_schema(client_for, cast):
    response = client_for("operator").get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = response.json()["paths"]
    base = "/api/tenants/{slug}/adapters/"
    expected = {base: {"get", "post"}, base + "{name}/": {"get", "patch", "delete"},
                base + "{name}/versions/": {"get", "post"}, base + "{name}/versions/{version}/": {"get", "delete"},
                base + "{name}/uploads/": {"post"}, base + "{name}/uploads/{upload_id}/": {"get", "delete"},
                base + "{name}/uploads/{upload_id}/complete/": {"post"}}
    assert {path: set(paths.get(path, {})) - {"parameters"} for path in expected} == expected
    upload = paths[base + "{name}/versions/"]["post"]
    assert set(upload["requestBody"]["content"]) == {"multipart/form-data", "application/zip", "application/gzip"}
    assert {"202", "401", "403", "404", "409", "411", "413", "503"} <= set(upload["responses"])
    assert all(op["tags"] == ["adapters"] for path in expected for op in paths[path].values() if "tags" in op)
    complete = paths[base + "{name}/uploads/{upload_id}/complete/"]["post"]
    codes = ("upload_incomplete", "upload_completed", "upload_aborted", "upload_expired", "upload_streaming")
    assert "409" in complete["responses"] and all(f"`{code}`" in complete["description"] for code in codes)
    abort = paths[base + "{name}/uploads/{upload_id}/"]["delete"]
    assert "409" in abort["responses"] and "`upload_completed`" in abort["description"]
    name = response.json()["components"]["schemas"]["AdapterCreateRequest"]["properties"]["name"]
    assert name["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"  # what the API enforces
    for bad in ("a/b", "x:1", "-x", "ü"):
        refused = client_for("owner").post(f"/api/tenants/{cast.tenant.slug}/adapters/", {"name": bad}, format="json")
        assert refused.status_code == 400 and "adapter name" in refused.json()["errors"][0]["detail"], bad


def test_a_big_streamed_upload_goes_to_the_store_in_parts(settings, monkeypatch, owner, cast, tiny_good_adapter,
                                                          tmp_path):
    import random

    from adapters.storage import ObjectStore

    settings.ADAPTER_UPLOAD_PART_BYTES = 5 << 20
    parts = []
    real_upload_part = ObjectStore.upload_part

    def counted_upload_part(self, key, upload_id, number, data):
        parts.append(len(data))  # what the handler held in memory at most: one part
        return real_upload_part(self, key, upload_id, number, data)

    monkeypatch.setattr(ObjectStore, "upload_part", counted_upload_part)
    folder = tmp_path / "with-notes"
    folder.mkdir()
    for name in (CONFIG, WEIGHTS):
        (folder / name).write_bytes((tiny_good_adapter / name).read_bytes())
    (folder / "notes.txt").write_bytes(random.Random(0).randbytes(7 << 20))
    archive = archives.zip_folder(folder, tmp_path / "a.zip")
    response = owner.generic("POST", versions_path(cast), archive.read_bytes(), content_type="application/zip")
    assert response.status_code == 202, response.content
    assert parts[0] >= 5 << 20 and sum(parts) == archive.stat().st_size and len(parts) == 2
    version = AdapterVersion.objects.get(adapter__tenant=cast.tenant)
    services.adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    assert version.status == "ready", version.failure_reason
