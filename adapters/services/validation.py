"""Validation of an uploaded version, run by a Celery task: download the staged bytes, unpack and check them
with the engine's own rules (engine/lora/format.py), store the normalized folder, warm-load it on an engine,
then mark the version `ready`, or `failed` with the exact reason and nothing left in the store.

Idempotent: a version already finished (or deleted) is left alone, and a run cut short (a lost worker) is
simply run again from the staged bytes, which stay until the version is finished.
"""

import logging
import tempfile
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ObjectDoesNotExist
from django.db import transaction
from django.utils import timezone

from adapters.base_model import base_model_fingerprint
from adapters.engine_client import EngineError, adapter_source, unload_everywhere, warm_load
from adapters.errors import TransientFailure
from adapters.models import AdapterUpload, AdapterVersion
from adapters.selectors import adapter_storage_used
from adapters.services.adapters import lock_tenant, locked
from adapters.services.purge import UNLOAD_TIMEOUT_S, upload_staging_purge
from adapters.storage import ObjectMissing, ObjectTooLarge, StoreUnavailable, object_store, version_uri
from adapters.validation import ReceivedFile, ValidatedAdapter, validate_upload
from engine.lora.format import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, AdapterFormatError, ModelFingerprint
from tenants.selectors import quota_effective

logger = logging.getLogger(__name__)
Status = AdapterVersion.Status
# A validation takes seconds (minutes with every retry); one unfinished after this lost its task.
STALE_VALIDATION = timedelta(minutes=30)


class _Refused(Exception):
    """The version cannot become ready: ``code`` and ``message`` go to its failure fields."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


def adapter_version_validate(*, version_id: int, final_attempt: bool = True) -> str | None:
    """Validate the version; return its resulting status (None when there was nothing to do).

    Raises TransientFailure when the store or every engine is unreachable, unless ``final_attempt``, in which
    case the version fails with `store_unavailable` or the engine's code."""
    version = _begin(version_id)
    if version is None:
        return None
    try:
        _run(version)
    except _Refused as exc:
        _fail(version, exc.code, exc.message)
    except (StoreUnavailable, EngineError) as exc:
        if getattr(exc, "retryable", True) and not final_attempt:
            raise TransientFailure(str(exc)) from exc
        code = exc.code if isinstance(exc, EngineError) else "store_unavailable"
        _fail(version, code, getattr(exc, "message", str(exc)))
    except ObjectDoesNotExist:
        # The rows went away under us (their tenant was deleted): nothing is left to validate; the objects
        # stored meanwhile sit under a prefix no row names and are left to the bucket's lifecycle rules.
        logger.info("adapter version %s vanished during validation", version_id)
        return None
    return AdapterVersion.objects.filter(pk=version_id).values_list("status", flat=True).first()


def _begin(version_id: int) -> AdapterVersion | None:
    with transaction.atomic():
        version = locked(AdapterVersion.objects.select_related("adapter__tenant")).filter(pk=version_id).first()
        if version is None or version.deleted_at is not None or version.is_finished:
            return None
        version.status = Status.VALIDATING
        version.save(update_fields=["status"])
    return version


def _run(version: AdapterVersion) -> None:
    fingerprint = _fingerprint()
    with tempfile.TemporaryDirectory(prefix="adapter-validate-") as tmp:
        work = Path(tmp)
        try:
            result = validate_upload(_download(version, work), work, fingerprint, settings.MAX_LORA_RANK)
        except AdapterFormatError as exc:
            raise _Refused(exc.code, exc.message) from None
        _charge_storage(version, result.size_bytes)
        store = object_store()
        for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
            store.put_file(version.storage_prefix + name, result.folder / name)
    warm_loaded = _warm_load(version, result.sha256)
    _finish(version, result, fingerprint, warm_loaded)


def _fingerprint() -> ModelFingerprint:
    try:
        return base_model_fingerprint()
    except ImproperlyConfigured as exc:
        raise _Refused("base_model_unavailable", str(exc)) from None


def _download(version: AdapterVersion, work: Path) -> list[ReceivedFile]:
    upload = AdapterUpload.objects.get(version=version)
    staged = work / "staged"
    staged.mkdir()
    store, files = object_store(), []
    for index, item in enumerate(upload.files):
        dest = staged / str(index)
        try:
            store.download(item["key"], dest, max_bytes=item["size"])
        except ObjectMissing:
            raise _Refused("upload_missing", f"the uploaded {item['name']} is no longer in the store") from None
        except ObjectTooLarge:
            raise _Refused("upload_size_mismatch", f"the uploaded {item['name']} is over its {item['size']} "
                           "declared bytes") from None
        files.append(ReceivedFile(name=item["name"], path=dest))
    return files


def _charge_storage(version: AdapterVersion, size: int) -> None:
    """The unpacked adapter must fit in what the tenant's storage quota leaves; its size is charged from now."""
    with transaction.atomic():
        tenant = lock_tenant(version.adapter.tenant)
        limit = quota_effective(tenant=tenant).max_adapter_storage_bytes
        used = adapter_storage_used(tenant=tenant, exclude_version_id=version.pk)
        if used + size > limit:
            raise _Refused("storage_quota_exceeded", f"the adapter is {size} bytes but only {max(0, limit - used)} "
                           f"of the tenant's {limit} bytes of adapter storage are left")
        AdapterVersion.objects.filter(pk=version.pk).update(size_bytes=size)


def _warm_load(version: AdapterVersion, sha256: str) -> bool:
    if not settings.ADAPTER_WARM_LOAD:
        return False
    source = adapter_source(engine_id=version.engine_id, uri=version_uri(version.storage_prefix), sha256=sha256)
    warm_load(settings.ENGINE_URLS, settings.ENGINE_API_KEY, source, timeout=settings.ADAPTER_WARM_LOAD_TIMEOUT_S)
    return True


def _finish(version: AdapterVersion, result: ValidatedAdapter, fingerprint: ModelFingerprint,
            warm_loaded: bool) -> None:
    now = timezone.now()
    with transaction.atomic():
        current = locked(AdapterVersion.objects).get(pk=version.pk)
        # Deleted meanwhile (its purge may have run before these objects were stored), or failed by a
        # concurrent run that removed its objects: nothing of this run may stay.
        discard = current.deleted_at is not None or current.status == Status.FAILED
        if not discard:
            spec = result.spec
            AdapterVersion.objects.filter(pk=version.pk).update(
                status=Status.READY, failure_code="", failure_reason="", size_bytes=result.size_bytes,
                sha256=result.sha256, rank=spec.rank, alpha=spec.alpha, target_modules=list(spec.target_modules),
                spec=spec.to_dict(), base_fingerprint=fingerprint.digest, validated_at=now,
                warm_loaded_at=now if warm_loaded else None,
            )
    if discard:
        if not _remove_objects(version, unload=True):  # the store failed: leave the removal to the sweep, even
            AdapterVersion.objects.filter(pk=version.pk).update(purged_at=None)  # if a purge already ran
    else:
        upload_staging_purge(AdapterUpload.objects.get(version=version))


def _fail(version: AdapterVersion, code: str, message: str) -> None:
    """Remove whatever this version stored, then record why it failed (unless a concurrent run finished it)."""
    with transaction.atomic():
        current = locked(AdapterVersion.objects).get(pk=version.pk)
        if current.is_finished:
            return
        removed = _remove_objects(version, unload=False)
        current.status, current.failure_code, current.failure_reason = Status.FAILED, code[:64], message[:4000]
        current.validated_at = timezone.now()
        current.purged_at = current.validated_at if removed else None  # else the sweep finishes the removal
        current.save(update_fields=["status", "failure_code", "failure_reason", "validated_at", "purged_at"])
    logger.info("adapter version %s failed: %s: %s", version.engine_id, code, message)


def _remove_objects(version: AdapterVersion, *, unload: bool) -> bool:
    if unload and settings.ENGINE_URLS:
        unload_everywhere(settings.ENGINE_URLS, settings.ENGINE_API_KEY, version.engine_id, timeout=UNLOAD_TIMEOUT_S)
    try:
        object_store().delete_prefix(version.storage_prefix)
    except StoreUnavailable as exc:
        logger.warning("objects of %s not removed yet: %s", version.engine_id, exc)
        return False
    upload = AdapterUpload.objects.filter(version=version).first()
    return upload is None or upload_staging_purge(upload)


def adapter_versions_revalidate_stale() -> int:
    """Enqueue validation again for versions whose task was lost (a broker outage, a task that crashed on its
    last attempt); validation is idempotent, so a slow one running twice does no harm. How many."""
    from adapters import tasks

    stale = AdapterVersion.objects.filter(status__in=[Status.UPLOADED, Status.VALIDATING], deleted_at__isnull=True,
                                          created_at__lt=timezone.now() - STALE_VALIDATION)
    ids = list(stale.values_list("pk", flat=True))
    for version_id in ids:
        tasks.adapter_version_validate.delay(version_id)
    return len(ids)
