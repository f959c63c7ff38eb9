"""Celery tasks of the registry (thin: the work is in adapters.services). All run with acks_late, so a task
whose worker dies is delivered again; each is idempotent. Transient store/engine failures retry with backoff
up to ADAPTER_TASK_MAX_RETRIES; the last attempt settles the outcome instead of retrying."""

from celery import shared_task
from django.conf import settings

from adapters import services
from adapters.errors import TransientFailure


def _is_final(task) -> bool:
    return task.request.retries >= settings.ADAPTER_TASK_MAX_RETRIES


def _retry(task, exc: Exception):
    return task.retry(exc=exc, countdown=min(60, 2 ** task.request.retries))


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_version_validate(self, version_id: int) -> str | None:
    """Validate an uploaded version and warm-load it; it ends `ready` or `failed`."""
    try:
        return services.adapter_version_validate(version_id=version_id, final_attempt=_is_final(self))
    except TransientFailure as exc:
        raise _retry(self, exc) from exc


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_version_purge(self, version_id: int) -> bool:
    """Unload a deleted version from every engine, then delete its objects."""
    try:
        return services.adapter_version_purge(version_id=version_id, require_unload=not _is_final(self))
    except TransientFailure as exc:
        if _is_final(self):
            raise  # the beat sweep tries again later
        raise _retry(self, exc) from exc


@shared_task(bind=True, acks_late=True, max_retries=None)
def adapter_purge(self, adapter_id: int) -> int:
    """Unload and purge every version of a deleted adapter, and its aborted uploads' staged bytes."""
    try:
        return services.adapter_purge(adapter_id=adapter_id, require_unload=not _is_final(self))
    except TransientFailure as exc:
        if _is_final(self):
            raise
        raise _retry(self, exc) from exc


@shared_task(acks_late=True)
def registry_sweep() -> dict:
    """Beat: expire abandoned uploads, finish purges that tasks could not (store outages, lost tasks)."""
    expired = services.uploads_expire()
    return {"expired_uploads": expired, **services.registry_sweep()}
