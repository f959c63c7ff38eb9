"""Celery tasks of the schema registry (thin: the work is in schemas.compiling), with the adapter registry's
delivery rules: acks_late and idempotent; engines down retry with backoff (5 s doubling to 5 min) up to
ADAPTER_TASK_MAX_RETRIES, the last attempt settles the version, and the beat sweep re-queues what a lost task left."""

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from adapters.errors import TransientFailure
from schemas import compiling


@shared_task(bind=True, acks_late=True, max_retries=None)
def schema_version_compile(self, version_id: int) -> str | None:
    """Compile a saved version on every engine; it ends `ready` or `failed`."""
    final = self.request.retries >= settings.ADAPTER_TASK_MAX_RETRIES
    try:
        return compiling.schema_version_compile(version_id=version_id, final_attempt=final)
    except (TransientFailure, OperationalError) as exc:
        if final:
            raise
        raise self.retry(exc=exc, countdown=min(300, 5 * 2 ** self.request.retries)) from None


@shared_task(acks_late=True)
def schemas_sweep() -> dict:
    """Beat: compile again what lost its task."""
    return {"recompiled": compiling.schema_versions_recompile_stale()}
