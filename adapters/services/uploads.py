"""Writes about uploads: reserve quota for the declared bytes, hand out presigned direct-to-S3 targets or take
streamed files, complete into a new version (validation is enqueued on commit), abort, expire.

The declared size is charged to the tenant's storage quota from the reservation on, so concurrent uploads
cannot overrun it; quota and platform limits are checked before a single byte is accepted.
"""

import logging
import math
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from adapters.errors import LengthRequired, StoreUnavailableError, UploadStateError, UploadTooLarge
from adapters.models import Adapter, AdapterUpload, AdapterVersion
from adapters.selectors import adapter_storage_used
from adapters.services.adapters import check_tenant_active, lock_tenant, locked
from adapters.services.purge import upload_staging_purge
from adapters.staging import MAX_FILES
from adapters.storage import ObjectMissing, StoreUnavailable, object_store, staging_key, version_prefix
from tenants.models import Tenant
from tenants.selectors import quota_effective

logger = logging.getLogger(__name__)
MAX_PARTS = 10_000  # S3's limit per multipart upload


def check_upload_size(*, tenant: Tenant, num_bytes: int) -> None:
    """UploadTooLarge when ``num_bytes`` more would pass the platform limit or the tenant's storage quota."""
    platform = settings.ADAPTER_MAX_UPLOAD_BYTES
    if num_bytes > platform:
        raise UploadTooLarge(f"The upload is {num_bytes} bytes; uploads may be at most {platform} bytes.")
    limit = quota_effective(tenant=tenant).max_adapter_storage_bytes
    used = adapter_storage_used(tenant=tenant)
    if used + num_bytes > limit:
        raise UploadTooLarge(
            f"The upload is {num_bytes} bytes but only {max(0, limit - used)} of the tenant's {limit} bytes of "
            "adapter storage are left.", code="storage_quota_exceeded",
        )


def upload_admit(*, tenant: Tenant, num_bytes: int | None) -> None:
    """The check of a streamed upload from its headers alone, before its body is read."""
    if num_bytes is None:
        raise LengthRequired("A streamed upload needs a Content-Length header.")
    check_tenant_active(tenant)
    check_upload_size(tenant=tenant, num_bytes=num_bytes)


def _checked_files(files: list[dict]) -> list[dict]:
    if not files or len(files) > MAX_FILES:
        raise ValidationError({"files": f"Declare 1 to {MAX_FILES} files."})
    checked = []
    for item in files:
        name, size = item.get("name"), item.get("size")
        if (not isinstance(name, str) or not 0 < len(name) <= 255 or name in (".", "..")
                or any(c in name for c in "/\\\x00")):
            raise ValidationError({"files": f"File name {name!r} must be a plain name of 1-255 characters."})
        if type(size) is not int or size < 0:
            raise ValidationError({"files": f"File size {size!r} must be a non-negative integer."})
        checked.append({"name": name, "size": size})
    return checked


@transaction.atomic
def _reserve(*, tenant: Tenant, adapter: Adapter, declared_bytes: int, files: list[dict], presigned: bool,
             created_by) -> AdapterUpload:
    tenant = lock_tenant(tenant)
    check_tenant_active(tenant)
    if not Adapter.objects.filter(pk=adapter.pk, tenant=tenant, deleted_at__isnull=True).exists():
        raise UploadStateError("The adapter has been deleted.", code="adapter_deleted")
    check_upload_size(tenant=tenant, num_bytes=declared_bytes)
    upload = AdapterUpload(tenant=tenant, adapter=adapter, presigned=presigned, declared_bytes=declared_bytes,
                           created_by=created_by,
                           expires_at=timezone.now() + timedelta(seconds=settings.ADAPTER_UPLOAD_TTL_S))
    upload.files = [{**item, "key": staging_key(upload_uuid=upload.uuid, index=i)} for i, item in enumerate(files)]
    upload.save()
    return upload


def part_sizes(size: int) -> list[int]:
    """How a file of ``size`` bytes is cut into parts (one part when it fits in ADAPTER_UPLOAD_PART_BYTES)."""
    part = max(settings.ADAPTER_UPLOAD_PART_BYTES, math.ceil(size / MAX_PARTS))
    if size <= part:
        return [size]
    return [part] * (size // part) + ([size % part] if size % part else [])


def upload_create_presigned(*, tenant: Tenant, adapter: Adapter, files: list[dict],
                            created_by=None) -> tuple[AdapterUpload, list[dict]]:
    """Reserve quota for the declared files and return presigned PUT targets on the public S3 endpoint:
    ``[{"name", "size", "part_sizes", "urls"}]``, one URL per part; each URL only takes its exact length.

    Every file but an empty one goes up as a multipart upload, even in one part: a plain presigned PUT cannot be
    revoked and would keep writing after the upload is completed or aborted, outside the quota, while a part
    URL dies with its multipart upload, which both end. (An empty file's PUT can only write an empty object;
    that, and whatever a PUT in flight still writes, the sweep removes once the URLs are dead.)"""
    files = _checked_files(files)
    upload = _reserve(tenant=tenant, adapter=adapter, declared_bytes=sum(f["size"] for f in files), files=files,
                      presigned=True, created_by=created_by)
    store, ttl = object_store(), settings.ADAPTER_UPLOAD_TTL_S
    targets = []
    try:
        for item in upload.files:
            sizes = part_sizes(item["size"])
            if item["size"] == 0:
                urls = [store.presign_put(item["key"], item["size"], ttl)]
            else:
                item["multipart_id"] = store.create_multipart(item["key"])
                urls = [store.presign_part(item["key"], item["multipart_id"], n, size, ttl)
                        for n, size in enumerate(sizes, start=1)]
            targets.append({"name": item["name"], "size": item["size"], "part_sizes": sizes, "urls": urls})
    except StoreUnavailable as exc:
        upload_abort(tenant=tenant, upload=upload)
        raise StoreUnavailableError(exc) from exc
    AdapterUpload.objects.filter(pk=upload.pk).update(files=upload.files)
    return upload, targets


def upload_begin_streamed(*, tenant: Tenant, adapter: Adapter, num_bytes: int, created_by=None) -> AdapterUpload:
    """Reserve quota for a streamed upload of ``num_bytes`` (its Content-Length); files are staged as they come."""
    return _reserve(tenant=tenant, adapter=adapter, declared_bytes=num_bytes, files=[], presigned=False,
                    created_by=created_by)


def upload_complete(*, tenant: Tenant, upload: AdapterUpload, received: list[dict] | None = None) -> AdapterVersion:
    """Turn the staged bytes into a new version (status `uploaded`) and enqueue its validation.

    Presigned uploads: every declared file must be in the store with exactly its declared size (multipart
    uploads are completed here). Streamed uploads: ``received`` lists what the request staged; a streamed
    upload is completed by its own request only. UploadStateError (409) with the code of what stands in the
    way (:func:`_check_open`), checked before the store is asked anything."""
    _check_open(upload, upload.adapter)
    if not upload.presigned and received is None:
        raise UploadStateError("The upload is being streamed; it completes when the request sending its files "
                               "ends.", code="upload_streaming")
    if upload.presigned:
        try:
            files = _finish_presigned(upload)
        except UploadStateError:
            upload.refresh_from_db()  # closed meanwhile (an abort won the race)? then that is the answer
            _check_open(upload, Adapter.objects.get(pk=upload.adapter_id))
            raise
    else:
        files = [{"name": f["name"], "key": f["key"], "size": f["size"]} for f in received or []]
        if not files:
            raise ValidationError({"files": "The upload holds no file."})
    return _complete(tenant=tenant, upload=upload, files=files)


def _check_open(upload: AdapterUpload, adapter: Adapter) -> None:
    """UploadStateError unless the upload may still be completed. Each closed state has its own code, so that a
    client repeating a complete learns what became of the upload, not what the store lacks now that its
    staged bytes are gone."""
    if adapter.deleted_at is not None:  # its pending uploads were aborted with it: say why
        raise UploadStateError("The adapter has been deleted.", code="adapter_deleted")
    if upload.status == AdapterUpload.Status.COMPLETED:
        raise UploadStateError(f"The upload is already completed{_as_version(upload)}.", code="upload_completed")
    # A direct upload closed at or after its expiry expired (the sweep aborts those), whoever closed it.
    if upload.presigned and upload.expires_at <= (upload.finished_at or timezone.now()):
        raise UploadStateError("The upload has expired; start a new one.", code="upload_expired")
    if upload.status == AdapterUpload.Status.ABORTED:
        raise UploadStateError("The upload was aborted; start a new one.", code="upload_aborted")


def _as_version(upload: AdapterUpload) -> str:
    version = upload.version
    return "" if version is None else f" as version {version.number}"


def _finish_presigned(upload: AdapterUpload) -> list[dict]:
    store = object_store()
    files = []
    try:
        for item in upload.files:
            if "multipart_id" in item:
                _finish_multipart(store, item)
            try:
                size = store.size_of(item["key"])
            except ObjectMissing:
                raise UploadStateError(f"{item['name']} has not been uploaded.") from None
            if size != item["size"]:
                raise UploadStateError(f"{item['name']} has {size} bytes; {item['size']} were declared.")
            files.append({"name": item["name"], "key": item["key"], "size": size})
    except StoreUnavailable as exc:
        raise StoreUnavailableError(exc) from exc
    return files


def _finish_multipart(store, item: dict) -> None:
    try:
        parts = store.list_parts(item["key"], item["multipart_id"])
    except ObjectMissing:
        return  # completed by an earlier call of complete
    expected = part_sizes(item["size"])
    if not parts:
        raise UploadStateError(f"{item['name']} has not been uploaded.")
    if [p["size"] for p in parts] != expected:
        raise UploadStateError(f"{item['name']}: {len(parts)} of {len(expected)} parts are uploaded with the "
                               "declared sizes.")
    try:
        store.complete_multipart(item["key"], item["multipart_id"], parts)
    except ObjectMissing:
        pass  # a concurrent complete finished it first; the size check and the locked re-check decide


@transaction.atomic
def _complete(*, tenant: Tenant, upload: AdapterUpload, files: list[dict]) -> AdapterVersion:
    from adapters import tasks

    adapter = locked(Adapter.objects).get(pk=upload.adapter_id)
    upload = locked(AdapterUpload.objects).get(pk=upload.pk, tenant=tenant)
    _check_open(upload, adapter)  # again, under the locks: a concurrent complete, abort or delete may have won
    number = adapter.next_version
    adapter.next_version = number + 1
    adapter.save(update_fields=["next_version", "updated_at"])
    version = AdapterVersion.objects.create(
        adapter=adapter, number=number, engine_id=f"adp_{adapter.uuid.hex}_v{number}",
        storage_prefix=version_prefix(tenant_id=tenant.pk, adapter_uuid=adapter.uuid, number=number),
        upload_bytes=sum(f["size"] for f in files), created_by=upload.created_by,
    )
    upload.status, upload.files, upload.version = AdapterUpload.Status.COMPLETED, files, version
    upload.finished_at = timezone.now()
    upload.save(update_fields=["status", "files", "version", "finished_at"])
    transaction.on_commit(lambda: tasks.adapter_version_validate.delay(version.pk), robust=True)
    return version


def upload_abort(*, tenant: Tenant, upload: AdapterUpload) -> AdapterUpload:
    """Abort a pending upload (its quota reservation ends now) and remove what it staged. Aborting an aborted
    upload removes its staged bytes again; a completed one is refused with `upload_completed` (its bytes are
    a version now, deleted as one)."""
    with transaction.atomic():
        upload = locked(AdapterUpload.objects).get(pk=upload.pk, tenant=tenant)
        if upload.status == AdapterUpload.Status.COMPLETED:
            raise UploadStateError(f"The upload is already completed{_as_version(upload)}; delete the version "
                                   "instead.", code="upload_completed")
        if upload.status == AdapterUpload.Status.PENDING:
            upload.status, upload.finished_at = AdapterUpload.Status.ABORTED, timezone.now()
            upload.save(update_fields=["status", "finished_at"])
    upload_staging_purge(upload)
    return upload


def upload_record_received(*, upload: AdapterUpload, received: list[dict]) -> None:
    """Remember what a streamed upload staged before it failed, so the abort can remove it."""
    AdapterUpload.objects.filter(pk=upload.pk).update(files=received)
    upload.files = received


def uploads_expire() -> int:
    """Abort pending uploads past their expiry (presigned URLs are dead by then); return how many."""
    expired = list(AdapterUpload.objects.filter(status=AdapterUpload.Status.PENDING, expires_at__lte=timezone.now()))
    for upload in expired:
        upload_abort(tenant=upload.tenant, upload=upload)
    return len(expired)
