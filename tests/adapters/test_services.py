"""Services and selectors with the real database and the real S3 (SeaweedFS), validation run in-process against
the tiny model: adapters and their quota, direct uploads (single and multipart) to `ready`, storage accounting,
resolution for the gateway, idempotent and retried validation, deletion and purge, and closed direct uploads
whose URLs write nothing that stays."""

import hashlib
import random
import time
from datetime import timedelta

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from adapters import selectors, services
from adapters.errors import QuotaExceeded, TransientFailure, UploadStateError, UploadTooLarge
from adapters.models import Adapter, AdapterUpload, AdapterVersion
from adapters.storage import ObjectStore, StoreUnavailable, object_store, staging_prefix
from tenants import services as tenant_services
from tests.adapters import archives
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import keys_under, leftovers, presigned_upload, put_targets
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db
READY, FAILED = AdapterVersion.Status.READY, AdapterVersion.Status.FAILED


@pytest.fixture
def tenant(s3, tiny_base):
    return TenantFactory()


@pytest.fixture
def adapter(tenant):
    return services.adapter_create(tenant=tenant, name="sql-helper", description="SQL from English")


def good_files(folder):
    return [folder / CONFIG, folder / WEIGHTS]


def validate(version: AdapterVersion) -> AdapterVersion:
    services.adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    return version


# ---------------------------------------------------------------- adapters


def test_adapter_count_quota_and_live_name_uniqueness(tenant):
    tenant_services.quota_set(tenant=tenant, changes={"max_adapters": 2})
    first = services.adapter_create(tenant=tenant, name="a")
    services.adapter_create(tenant=tenant, name="b")
    with pytest.raises(QuotaExceeded, match="has 2 adapters; its quota allows 2") as caught:
        services.adapter_create(tenant=tenant, name="c")
    assert caught.value.code == "adapter_quota_exceeded"
    services.adapter_delete(tenant=tenant, adapter=first)
    again = services.adapter_create(tenant=tenant, name="a")  # the deleted one frees its name and its slot
    assert again.pk != first.pk and again.uuid != first.uuid
    with pytest.raises(ValidationError, match="exists"):
        services.adapter_create(tenant=tenant, name="b")
    assert services.adapter_create(tenant=TenantFactory(), name="b").name == "b"  # names are per tenant


@pytest.mark.parametrize("name", ["", "has space", "ver:2", "-dash-first", "x" * 101, "../up"])
def test_bad_adapter_names_are_refused(tenant, name):
    with pytest.raises(ValidationError):
        services.adapter_create(tenant=tenant, name=name)


def test_a_suspended_tenant_cannot_add_adapters_or_uploads(tenant, adapter):
    tenant_services.tenant_set_status(tenant=tenant, status="suspended")
    with pytest.raises(ValidationError, match="suspended"):
        services.adapter_create(tenant=tenant, name="new")
    with pytest.raises(ValidationError, match="suspended"):
        services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": CONFIG, "size": 10}])


# ---------------------------------------------------------------- direct uploads to ready


def test_a_direct_upload_of_the_two_files_becomes_ready(tenant, adapter, tiny_good_adapter, tiny_fingerprint):
    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    assert (version.number, version.status) == (1, AdapterVersion.Status.UPLOADED)
    assert version.engine_id == f"adp_{adapter.uuid.hex}_v1"
    assert version.storage_prefix == f"tenants/{tenant.pk}/adapters/{adapter.uuid}/v1/"
    version = validate(version)
    weights = (tiny_good_adapter / WEIGHTS).read_bytes()
    assert version.status == READY, version.failure_reason
    assert (version.rank, version.alpha, version.target_modules) == (8, 16.0, ["q_proj", "v_proj"])
    assert version.sha256 == hashlib.sha256(weights).hexdigest()
    assert version.base_fingerprint == tiny_fingerprint.digest and version.warm_loaded_at is None
    # Only the normalized folder is stored, under the version's prefix; the staged upload is gone.
    assert keys_under(version.storage_prefix) == [version.storage_prefix + CONFIG, version.storage_prefix + WEIGHTS]
    assert keys_under(staging_prefix(version.upload.uuid)) == []
    assert version.size_bytes == len(weights) + object_store().size_of(version.storage_prefix + CONFIG)
    served = selectors.adapter_resolve(tenant_id=tenant.pk, ref="sql-helper")
    assert served.source() == {"id": version.engine_id, "sha256": version.sha256,
                               "uri": f"s3://lora-adapters/{version.storage_prefix}"}


def test_a_big_archive_goes_up_in_parts_and_becomes_ready(settings, tenant, adapter, tiny_good_adapter, tmp_path):
    settings.ADAPTER_UPLOAD_PART_BYTES = 5 << 20
    folder = tmp_path / "with-notes"
    folder.mkdir()
    for name in (CONFIG, WEIGHTS):
        (folder / name).write_bytes((tiny_good_adapter / name).read_bytes())
    (folder / "notes.bin.txt").write_bytes(random.Random(0).randbytes(6 << 20))  # 6 MiB deflate cannot shrink
    archive = archives.zip_folder(folder, tmp_path / "adapter.zip")
    upload, targets = services.upload_create_presigned(
        tenant=tenant, adapter=adapter, files=[{"name": archive.name, "size": archive.stat().st_size}])
    assert targets[0]["part_sizes"][0] == 5 << 20 and len(targets[0]["urls"]) == 2
    put_targets(targets, [archive])
    version = validate(services.upload_complete(tenant=tenant, upload=upload))
    assert version.status == READY, version.failure_reason
    assert version.upload_bytes == archive.stat().st_size and version.size_bytes < version.upload_bytes
    assert keys_under(version.storage_prefix) == [version.storage_prefix + CONFIG, version.storage_prefix + WEIGHTS]


def test_the_store_refuses_bytes_beyond_the_signed_length(tenant, adapter, tiny_good_adapter):
    upload, targets = services.upload_create_presigned(
        tenant=tenant, adapter=adapter, files=[{"name": CONFIG, "size": 10}, {"name": WEIGHTS, "size": 10}])
    response = httpx.put(targets[0]["urls"][0], content=b"x" * 11)
    assert response.status_code == 403
    with pytest.raises(UploadStateError, match="adapter_config.json has not been uploaded"):
        services.upload_complete(tenant=tenant, upload=upload)
    upload.refresh_from_db()
    assert upload.status == AdapterUpload.Status.PENDING  # PUT the right bytes and complete again
    assert keys_under(staging_prefix(upload.uuid)) == []


def test_an_upload_over_the_storage_quota_is_refused_before_any_url_exists(tenant, adapter):
    tenant_services.quota_set(tenant=tenant, changes={"max_adapter_storage_bytes": 1000})
    with pytest.raises(UploadTooLarge, match="only 1000 of the tenant's 1000 bytes") as caught:
        services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "a.zip", "size": 1001}])
    assert caught.value.code == "storage_quota_exceeded"
    assert not AdapterUpload.objects.filter(adapter=adapter).exists()


def test_storage_accounting_counts_reservations_and_versions_but_not_failures(tenant, adapter, tiny_good_adapter,
                                                                              tiny_cases):
    upload, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter,
                                                 files=[{"name": "a.zip", "size": 700}])
    assert selectors.adapter_storage_used(tenant=tenant) == 700  # reserved until completed, aborted or expired
    services.upload_abort(tenant=tenant, upload=upload)
    assert selectors.adapter_storage_used(tenant=tenant) == 0
    ready = validate(presigned_upload(tenant, adapter, good_files(tiny_good_adapter)))
    failed = validate(presigned_upload(tenant, adapter, list(tiny_cases["truncated"].files)))
    assert (ready.status, failed.status) == (READY, FAILED)
    assert selectors.adapter_storage_used(tenant=tenant) == ready.size_bytes
    expired, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "b.zip", "size": 5}])
    AdapterUpload.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert selectors.adapter_storage_used(tenant=tenant) == ready.size_bytes
    assert services.uploads_expire() == 1
    assert AdapterUpload.objects.get(pk=expired.pk).status == AdapterUpload.Status.ABORTED


def test_the_unpacked_size_is_charged_at_validation(tenant, adapter, tiny_good_adapter, tmp_path):
    archive = archives.zip_folder(tiny_good_adapter, tmp_path / "a.zip")  # fp32 noise deflates a little
    normalized = sum((tiny_good_adapter / n).stat().st_size for n in (CONFIG, WEIGHTS))
    assert archive.stat().st_size < normalized - 100
    tenant_services.quota_set(tenant=tenant, changes={"max_adapter_storage_bytes": archive.stat().st_size})
    version = validate(presigned_upload(tenant, adapter, [archive]))
    assert (version.status, version.failure_code) == (FAILED, "storage_quota_exceeded")
    assert "bytes of adapter storage are left" in version.failure_reason
    assert leftovers(version) == []


# ---------------------------------------------------------------- failures leave nothing


@pytest.mark.parametrize("case", ["wrong_shape", "zip_slip", "pickle_bin"])
def test_a_bad_upload_fails_with_its_reason_and_leaves_nothing(tenant, adapter, tiny_cases, case):
    version = validate(presigned_upload(tenant, adapter, list(tiny_cases[case].files)))
    assert (version.status, version.failure_code) == (FAILED, tiny_cases[case].code)
    assert tiny_cases[case].reason in version.failure_reason
    assert version.purged_at is not None and leftovers(version) == []
    assert selectors.adapter_resolve(tenant_id=tenant.pk, ref="sql-helper") is None


# ---------------------------------------------------------------- idempotence and retries


def test_validation_is_idempotent_and_resumes_a_run_cut_short(tenant, adapter, tiny_good_adapter):
    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    AdapterVersion.objects.filter(pk=version.pk).update(status=AdapterVersion.Status.VALIDATING)  # a lost worker
    assert services.adapter_version_validate(version_id=version.pk) == READY
    validated_at = AdapterVersion.objects.get(pk=version.pk).validated_at
    assert services.adapter_version_validate(version_id=version.pk) is None  # finished: left alone
    assert AdapterVersion.objects.get(pk=version.pk).validated_at == validated_at
    assert services.adapter_version_validate(version_id=10**9) is None  # gone (a rolled-back row): nothing


class FlakyStore(ObjectStore):
    """The real store, except that the first ``failures`` downloads find it unreachable."""

    def __init__(self, failures: int):
        real = object_store()
        super().__init__(real.client, real.public_client, real.bucket)
        self.failures = failures

    def download(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("object store unreachable: simulated")
        return super().download(*args, **kwargs)


def test_a_transient_store_error_retries_and_the_last_attempt_settles(monkeypatch, tenant, adapter,
                                                                      tiny_good_adapter):
    flaky = FlakyStore(failures=1)
    monkeypatch.setattr("adapters.services.validation.object_store", lambda: flaky)
    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    with pytest.raises(TransientFailure):
        services.adapter_version_validate(version_id=version.pk, final_attempt=False)
    assert AdapterVersion.objects.get(pk=version.pk).status == AdapterVersion.Status.VALIDATING
    assert services.adapter_version_validate(version_id=version.pk, final_attempt=False) == READY

    flaky.failures = 1
    other = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    assert services.adapter_version_validate(version_id=other.pk, final_attempt=True) == FAILED
    other.refresh_from_db()
    assert other.failure_code == "store_unavailable" and "simulated" in other.failure_reason


def test_the_store_refusing_the_platforms_access_is_an_outage_not_the_uploads_fault(monkeypatch, tenant, adapter,
                                                                                     tiny_good_adapter):
    from botocore.exceptions import ClientError

    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    store = object_store()
    real_get = store.client.get_object

    def denied(**kwargs):
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                           "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")

    monkeypatch.setattr(store.client, "get_object", denied)
    with pytest.raises(TransientFailure):  # retried (it stayed `validating` with no reason for good before)
        services.adapter_version_validate(version_id=version.pk, final_attempt=False)
    assert services.adapter_version_validate(version_id=version.pk, final_attempt=True) == FAILED
    version.refresh_from_db()
    assert version.failure_code == "store_unavailable" and "AccessDenied" in version.failure_reason
    monkeypatch.setattr(store.client, "get_object", real_get)


def test_the_celery_task_retries_transient_errors(monkeypatch, settings, tenant, adapter, tiny_good_adapter):
    from adapters import tasks

    flaky = FlakyStore(failures=2)
    monkeypatch.setattr("adapters.services.validation.object_store", lambda: flaky)
    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    result = tasks.adapter_version_validate.apply(args=[version.pk])  # eager: retries run at once
    assert result.get() == READY and flaky.failures == 0
    assert tasks.adapter_version_validate.acks_late


# ---------------------------------------------------------------- resolution and deletion


def test_resolution_takes_the_newest_ready_version_unless_pinned(tenant, adapter, tiny_good_adapter, tiny_cases):
    v1 = validate(presigned_upload(tenant, adapter, good_files(tiny_good_adapter)))
    v2 = validate(presigned_upload(tenant, adapter, good_files(tiny_good_adapter)))
    v3 = validate(presigned_upload(tenant, adapter, list(tiny_cases["truncated"].files)))
    assert (v1.status, v2.status, v3.status) == (READY, READY, FAILED)
    resolve = lambda ref: selectors.adapter_resolve(tenant_id=tenant.pk, ref=ref)
    assert resolve("sql-helper").version == 2
    assert resolve("sql-helper:1").engine_id == v1.engine_id
    assert resolve("sql-helper:3") is None and resolve("sql-helper:9") is None and resolve("nope") is None
    assert selectors.adapter_resolve(tenant_id=TenantFactory().pk, ref="sql-helper") is None
    with pytest.raises(ValueError, match="NAME or NAME:VERSION"):
        resolve("sql-helper:v2")
    services.adapter_version_delete(tenant=tenant, version=v2)
    assert resolve("sql-helper").version == 1 and resolve("sql-helper:2") is None  # at once, before any purge
    assert services.adapter_version_purge(version_id=v2.pk)
    assert keys_under(v2.storage_prefix) == [] and keys_under(v1.storage_prefix) != []


@pytest.mark.django_db(transaction=True)  # the async ORM runs on another thread, with its own connection
def test_async_resolution_for_the_gateway(tenant, adapter, tiny_good_adapter, captured_tasks):
    import asyncio

    version = validate(presigned_upload(tenant, adapter, good_files(tiny_good_adapter)))
    served = asyncio.run(selectors.adapter_resolve_async(tenant_id=tenant.pk, ref="sql-helper:1"))
    assert (served.name, served.version, served.sha256) == ("sql-helper", 1, version.sha256)
    assert asyncio.run(selectors.adapter_resolve_async(tenant_id=tenant.pk, ref="sql-helper:2")) is None


def test_deleting_an_adapter_hides_it_at_once_and_the_purge_removes_every_object(tenant, adapter,
                                                                                  tiny_good_adapter):
    versions = [validate(presigned_upload(tenant, adapter, good_files(tiny_good_adapter))) for _ in range(2)]
    pending, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "x.zip",
                                                                                            "size": 5}])
    services.adapter_delete(tenant=tenant, adapter=adapter)
    assert selectors.adapter_resolve(tenant_id=tenant.pk, ref="sql-helper") is None
    assert not selectors.adapter_list(tenant=tenant).exists()
    assert AdapterUpload.objects.get(pk=pending.pk).status == AdapterUpload.Status.ABORTED
    assert selectors.adapter_storage_used(tenant=tenant) == 0
    assert services.adapter_purge(adapter_id=adapter.pk) == 2
    for version in versions:
        version.refresh_from_db()
        assert version.purged_at is not None and leftovers(version) == []
    assert services.adapter_purge(adapter_id=adapter.pk) == 0  # idempotent
    assert Adapter.objects.filter(pk=adapter.pk, deleted_at__isnull=False).exists()  # soft: the row stays


def test_the_sweep_removes_what_a_failed_cleanup_left(tenant, adapter, tiny_cases):
    version = validate(presigned_upload(tenant, adapter, list(tiny_cases["truncated"].files)))
    object_store().put_bytes(version.storage_prefix + WEIGHTS, b"left behind by an outage")
    AdapterVersion.objects.filter(pk=version.pk).update(purged_at=None)
    assert services.registry_sweep()["versions"] == 1
    assert keys_under(version.storage_prefix) == []


def test_presigned_urls_point_browsers_at_the_public_endpoint(settings, tenant, adapter):
    settings.S3_PUBLIC_ENDPOINT_URL = "https://files.example.com"
    _, targets = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "a.zip",
                                                                                            "size": 10}])
    url = targets[0]["urls"][0]
    assert url.startswith("https://files.example.com/lora-adapters/uploads/") and "content-length" in url


# ---------------------------------------------------------------- closed direct uploads: their URLs write nothing

BLOB = 3 << 20  # the reviewer's 3 MiB


def test_aborting_a_direct_upload_ends_its_urls(tenant, adapter):
    upload, targets = services.upload_create_presigned(tenant=tenant, adapter=adapter,
                                                       files=[{"name": "blob", "size": BLOB}])
    services.upload_abort(tenant=tenant, upload=upload)
    response = httpx.put(targets[0]["urls"][0], content=b"x" * BLOB, timeout=30)
    assert response.status_code == 404, response.text  # the store no longer knows the multipart upload
    assert keys_under(staging_prefix(upload.uuid)) == []
    assert selectors.adapter_storage_used(tenant=tenant) == 0


def test_completing_a_direct_upload_ends_its_urls(tenant, adapter, tiny_good_adapter):
    paths = good_files(tiny_good_adapter)
    upload, targets = services.upload_create_presigned(
        tenant=tenant, adapter=adapter, files=[{"name": p.name, "size": p.stat().st_size} for p in paths])
    assert all(len(target["urls"]) == 1 for target in targets)  # small files: one part each
    put_targets(targets, paths)
    version = validate(services.upload_complete(tenant=tenant, upload=upload))
    assert version.status == READY and keys_under(staging_prefix(upload.uuid)) == []
    for target, path in zip(targets, paths, strict=True):
        response = httpx.put(target["urls"][0], content=path.read_bytes(), timeout=30)
        assert response.status_code == 404, response.text
    assert keys_under(staging_prefix(upload.uuid)) == []


def test_what_a_plain_put_url_writes_after_the_abort_is_swept_once_it_is_dead(monkeypatch, settings, tenant,
                                                                               adapter):
    settings.ADAPTER_UPLOAD_TTL_S = 2
    monkeypatch.setattr("adapters.services.purge.PRESIGNED_URL_GRACE", timedelta(seconds=1), raising=False)
    upload, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter,
                                                 files=[{"name": "blob", "size": BLOB}])
    key, prefix = upload.files[0]["key"], staging_prefix(upload.uuid)
    # A URL no one can revoke, as uploads created before every file went up in parts were given.
    plain_url = object_store().presign_put(key, BLOB, settings.ADAPTER_UPLOAD_TTL_S)
    services.upload_abort(tenant=tenant, upload=upload)
    assert httpx.put(plain_url, content=b"x" * BLOB, timeout=30).status_code == 200
    assert services.registry_sweep()["uploads"] == 0  # the URL still lives: a removal now would not be the last
    assert keys_under(prefix) == [key]

    time.sleep(max(0.0, (upload.expires_at - timezone.now()).total_seconds()) + 1.5)
    assert httpx.put(plain_url, content=b"x" * BLOB, timeout=30).status_code == 403  # expired
    assert services.registry_sweep()["uploads"] == 1
    assert keys_under(prefix) == []
    assert AdapterUpload.objects.get(pk=upload.pk).purged_at > upload.expires_at + timedelta(seconds=1)
    assert services.registry_sweep()["uploads"] == 0  # that removal was the last: the sweep is done with it


def test_the_sweep_removes_what_arrived_after_a_completed_upload_and_keeps_the_version(tenant, adapter,
                                                                                        tiny_good_adapter):
    version = presigned_upload(tenant, adapter, good_files(tiny_good_adapter))
    upload, prefix = version.upload, staging_prefix(version.upload.uuid)
    closed = timezone.now() - timedelta(hours=2)  # completed and validated while its URLs lived, long ago
    AdapterUpload.objects.filter(pk=upload.pk).update(expires_at=closed + timedelta(minutes=30))
    assert services.registry_sweep()["uploads"] == 0  # not validated yet: validation reads the staged bytes
    assert len(keys_under(prefix)) == 2
    version = validate(version)
    assert version.status == READY and keys_under(prefix) == []
    AdapterUpload.objects.filter(pk=upload.pk).update(purged_at=closed)
    object_store().put_bytes(upload.files[0]["key"], b"x" * 1000)  # a PUT its URLs still took
    assert services.registry_sweep()["uploads"] == 1
    assert keys_under(prefix) == [] and len(keys_under(version.storage_prefix)) == 2
    assert selectors.adapter_resolve(tenant_id=tenant.pk, ref="sql-helper:1") is not None
    assert services.registry_sweep()["uploads"] == 0


def test_an_expired_upload_is_aborted_then_swept_again_once_its_urls_are_dead(tenant, adapter):
    upload, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "a", "size": 5}])
    expired = timezone.now() - timedelta(seconds=1)
    AdapterUpload.objects.filter(pk=upload.pk).update(expires_at=expired)
    assert services.uploads_expire() == 1
    assert services.registry_sweep()["uploads"] == 0  # aborted and purged, its URLs in their grace period
    AdapterUpload.objects.filter(pk=upload.pk).update(expires_at=expired - timedelta(hours=1),
                                                      purged_at=expired - timedelta(minutes=50))
    assert services.registry_sweep()["uploads"] == 1
    assert services.registry_sweep()["uploads"] == 0


def test_an_empty_file_gets_a_plain_put_url(tenant, adapter):
    upload, targets = services.upload_create_presigned(tenant=tenant, adapter=adapter,
                                                       files=[{"name": "empty", "size": 0}])
    upload.refresh_from_db()
    assert "multipart_id" not in upload.files[0]  # it can only ever write an empty object
    assert httpx.put(targets[0]["urls"][0], content=b"").status_code == 200
    assert services.upload_complete(tenant=tenant, upload=upload).upload_bytes == 0
