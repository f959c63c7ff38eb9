"""Celery tasks of the registry (thin: the work is in adapters.services). All run with acks_late, so a task
whose worker dies is delivered again; each is idempotent. Transient failures (object store or engines down, a
database deadlock or lost connection) retry with backoff (5 s doubling to 5 min: the default 8 retries span about 15
minutes, so a short outage does not fail a valid upload) up to ADAPTER_TASK_MAX_RETRIES; the last attempt of a
validation settles the version's outcome instead, and the beat sweep picks up whatever is still left."""

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from adapters import services
from adapters.errors import TransientFailure

TRANSIENT = (TransientFailure, OperationalError)


def _is_final(task) -> bool:
    return task.request.retries >= settings.ADAPTER_TASK_MAX_RETRIES


def _retry_or_raise(task, exc: Exception):
    if _is_final(task):
        raise exc
    raise task.retry(exc=exc, countdown=min(300, 5 * 2 ** task.request.retries))


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_version_validate(self, version_id: int) -> str | None:
    """Validate an uploaded version and warm-load it; it ends `ready` or `failed`."""
    try:
        return services.adapter_version_validate(version_id=version_id, final_attempt=_is_final(self))
    except TRANSIENT as exc:
        _retry_or_raise(self, exc)


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_version_purge(self, version_id: int) -> bool:
    """Unload a deleted version from every engine, then delete its objects."""
    try:
        return services.adapter_version_purge(version_id=version_id, require_unload=not _is_final(self))
    except TRANSIENT as exc:
        _retry_or_raise(self, exc)


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_purge(self, adapter_id: int) -> int:
    """Unload and purge every version of a deleted adapter, and its aborted uploads' staged bytes."""
    try:
        return services.adapter_purge(adapter_id=adapter_id, require_unload=not _is_final(self))
    except TRANSIENT as exc:
        _retry_or_raise(self, exc)


@shared_task(bind=True, acks_late=True, max_retries=None)
def tenant_objects_purge(self, purge_id: int) -> int:
    """After a tenant's deletion: engines unload its adapters, its objects and staged uploads are deleted."""
    try:
        return services.tenant_objects_purge(purge_id=purge_id, require_unload=not _is_final(self))
    except TRANSIENT as exc:
        _retry_or_raise(self, exc)


@shared_task(acks_late=True)
def registry_sweep() -> dict:
    """Beat: expire abandoned uploads, validate again what lost its task, finish purges tasks could not."""
    return {"expired_uploads": services.uploads_expire(),
            "revalidated": services.adapter_versions_revalidate_stale(), **services.registry_sweep()}
