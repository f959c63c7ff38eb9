"""Removal of what deleted, failed or abandoned versions and uploads left behind: engines are told to unload
deleted versions, then their objects and staged bytes are deleted. Idempotent; run by Celery tasks.

A presigned PUT URL cannot be revoked: until it expires it writes under its upload's staging prefix whatever the
upload's state. So the staged bytes of a closed direct upload are removed once more after its URLs are dead
(:data:`PRESIGNED_URL_GRACE` past ``expires_at``); only that removal is final.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from adapters.engine_client import unload_everywhere
from adapters.errors import TransientFailure
from adapters.models import AdapterUpload, AdapterVersion, TenantPurge
from adapters.storage import StoreUnavailable, object_store, staging_prefix, tenant_prefix

logger = logging.getLogger(__name__)
UNLOAD_TIMEOUT_S = 10
Status = AdapterVersion.Status
# How long after an upload's expires_at its presigned URLs may still write: the URLs are signed a moment after
# expires_at is set, the store checks expiry when a request starts (a PUT begun just before may take minutes
# to finish), and its clock may differ from ours.
PRESIGNED_URL_GRACE = timedelta(minutes=15)
# A deleted tenant's purge is left to its task this long before the sweep takes it over.
TENANT_PURGE_GRACE = timedelta(minutes=10)
# Closed uploads whose staged bytes one sweep removes at most (the rest wait for the next one).
SWEEP_MAX_UPLOADS = 500


def upload_staging_purge(upload: AdapterUpload) -> bool:
    """Delete an upload's staged objects and unfinished multipart uploads; False if the store is down.

    ``purged_at`` records when the removal began: anything that arrived after that is still there."""
    store, prefix, began = object_store(), staging_prefix(upload.uuid), timezone.now()
    try:
        store.abort_multipart_uploads(prefix)
        removed = store.delete_prefix(prefix)
    except StoreUnavailable as exc:
        logger.warning("staged bytes of upload %s not removed yet: %s", upload.uuid, exc)
        return False
    if removed and upload.purged_at is not None:
        logger.warning("removed %d objects that arrived under upload %s after it was closed", removed, upload.uuid)
    AdapterUpload.objects.filter(pk=upload.pk).update(purged_at=began)
    upload.purged_at = began
    return True


def _uploads_to_purge() -> QuerySet[AdapterUpload]:
    """Closed uploads whose staging prefix may hold objects: never purged, or (direct uploads) last purged while
    their presigned URLs could still write, and dead now. Completed uploads wait until their live version is
    validated (validation reads the staged bytes)."""
    dead_before = timezone.now() - PRESIGNED_URL_GRACE
    closed = AdapterUpload.objects.exclude(status=AdapterUpload.Status.PENDING).exclude(
        status=AdapterUpload.Status.COMPLETED, version__deleted_at__isnull=True,
        version__status__in=[Status.UPLOADED, Status.VALIDATING],
    )
    purged_while_urls_lived = Q(presigned=True, expires_at__lte=dead_before,
                                purged_at__lt=F("expires_at") + PRESIGNED_URL_GRACE)
    return closed.filter(Q(purged_at__isnull=True) | purged_while_urls_lived).order_by("expires_at", "pk")


def _unload(version: AdapterVersion, *, require_unload: bool) -> None:
    if version.status in (Status.READY, Status.VALIDATING):  # else nothing an engine could have loaded
        _unload_engine_ids([version.engine_id], require_unload=require_unload)


def _unload_engine_ids(engine_ids: list[str], *, require_unload: bool) -> None:
    """Every engine unloads these adapter versions; TransientFailure, with ``require_unload``, when an engine could
    not confirm it for a reason that may pass."""
    if not settings.ENGINE_URLS:
        return
    failures = {}
    for engine_id in engine_ids:
        failures.update(unload_everywhere(settings.ENGINE_URLS, settings.ENGINE_API_KEY, engine_id,
                                          timeout=UNLOAD_TIMEOUT_S))
    if not failures:
        return
    if require_unload and any(error.retryable for error in failures.values()):
        raise TransientFailure(f"engines did not confirm the unload of {', '.join(engine_ids)}: "
                               + "; ".join(str(e) for e in failures.values()))
    # Deleted versions never resolve, so no request can reach a copy an unreachable engine still holds.
    logger.warning("purging %s although engines did not unload them: %s", ", ".join(engine_ids), failures)


def adapter_version_purge(*, version_id: int, require_unload: bool = True) -> bool:
    """Unload (if it may be loaded) and delete the objects of a deleted or failed version; True when done now.

    Raises TransientFailure when the store (or, with ``require_unload``, an engine) is unreachable."""
    version = AdapterVersion.objects.filter(pk=version_id).first()
    if version is None or version.purged_at is not None:
        return False
    if version.deleted_at is None and version.status != Status.FAILED:
        return False  # live: nothing to purge
    if version.deleted_at is not None:
        _unload(version, require_unload=require_unload)
    try:
        object_store().delete_prefix(version.storage_prefix)
    except StoreUnavailable as exc:
        raise TransientFailure(f"objects of {version.engine_id} not deleted: {exc}") from exc
    upload = AdapterUpload.objects.filter(version=version).first()
    if upload is not None and upload.purged_at is None and not upload_staging_purge(upload):
        raise TransientFailure(f"staged bytes of {version.engine_id} not deleted")
    AdapterVersion.objects.filter(pk=version.pk).update(purged_at=timezone.now())
    return True


def adapter_purge(*, adapter_id: int, require_unload: bool = True) -> int:
    """Purge every deleted version of a deleted adapter and its aborted uploads; how many versions."""
    versions = AdapterVersion.objects.filter(adapter_id=adapter_id, deleted_at__isnull=False, purged_at__isnull=True)
    purged = sum(adapter_version_purge(version_id=pk, require_unload=require_unload)
                 for pk in versions.values_list("pk", flat=True))
    for upload in AdapterUpload.objects.filter(adapter_id=adapter_id, status=AdapterUpload.Status.ABORTED,
                                               purged_at__isnull=True):
        if not upload_staging_purge(upload):
            raise TransientFailure(f"staged bytes of upload {upload.uuid} not deleted")
    return purged


def tenant_purge_record(*, tenant_id: int) -> TenantPurge:
    """Record what a tenant's deletion will leave to remove (call in the deletion's transaction, before its rows
    go): the engine ids of versions an engine may hold and the staging prefixes of uploads not purged."""
    engine_ids = list(AdapterVersion.objects.filter(
        adapter__tenant_id=tenant_id, purged_at__isnull=True, status__in=(Status.READY, Status.VALIDATING),
    ).values_list("engine_id", flat=True))
    uploads = [str(u) for u in AdapterUpload.objects.filter(tenant_id=tenant_id, purged_at__isnull=True)
               .values_list("uuid", flat=True)]
    return TenantPurge.objects.create(tenant_id=tenant_id, engine_ids=engine_ids, upload_uuids=uploads)


def tenant_objects_purge(*, purge_id: int, require_unload: bool = True) -> int:
    """After a tenant was deleted: engines unload its adapters, and every object under its prefix and its uploads'
    staging prefixes is deleted. Idempotent; how many objects were deleted now. TransientFailure when the store
    (or, with ``require_unload``, an engine) is unreachable."""
    record = TenantPurge.objects.filter(pk=purge_id, purged_at__isnull=True).first()
    if record is None:
        return 0
    _unload_engine_ids(record.engine_ids, require_unload=require_unload)
    store = object_store()
    try:
        removed = store.delete_prefix(tenant_prefix(record.tenant_id))
        for upload_uuid in record.upload_uuids:
            store.abort_multipart_uploads(staging_prefix(upload_uuid))
            removed += store.delete_prefix(staging_prefix(upload_uuid))
    except StoreUnavailable as exc:
        raise TransientFailure(f"objects of deleted tenant {record.tenant_id} not deleted yet: {exc}") from exc
    TenantPurge.objects.filter(pk=record.pk).update(purged_at=timezone.now())
    logger.info("deleted tenant %s: %d objects removed, %d adapter versions unloaded", record.tenant_id, removed,
                len(record.engine_ids))
    return removed


def registry_sweep() -> dict[str, int]:
    """What tasks may have left (a lost task, a store outage): purge failed and deleted versions and finished
    uploads whose objects remain, and what presigned URLs wrote after their upload was closed (once they are
    dead). Run by Celery beat; cheap when there is nothing to do."""
    versions = AdapterVersion.objects.filter(purged_at__isnull=True).filter(
        deleted_at__isnull=False) | AdapterVersion.objects.filter(purged_at__isnull=True, status=Status.FAILED)
    purged = 0
    for pk in versions.values_list("pk", flat=True):
        try:
            purged += adapter_version_purge(version_id=pk, require_unload=False)
        except TransientFailure as exc:
            logger.warning("sweep: %s", exc)
    uploads = sum(upload_staging_purge(upload) for upload in _uploads_to_purge()[:SWEEP_MAX_UPLOADS])
    tenants = 0
    for pk in TenantPurge.objects.filter(purged_at__isnull=True, created_at__lte=timezone.now() - TENANT_PURGE_GRACE
                                         ).values_list("pk", flat=True)[:SWEEP_MAX_UPLOADS]:
        try:
            tenant_objects_purge(purge_id=pk, require_unload=False)
            tenants += 1
        except TransientFailure as exc:
            logger.warning("sweep: %s", exc)
    return {"versions": purged, "uploads": uploads, "deleted_tenants": tenants}
