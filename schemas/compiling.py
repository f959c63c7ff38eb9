"""The warm compile of a saved version, run by a Celery task: every engine replica compiles the schema into its
grammar cache under the tenant's cache salt (the one the gateway sends with the tenant's requests), so the first
request naming it pays no compile. The version ends `ready`, or `failed` with the engine's reason.

- An engine that refuses the schema (400: a feature its grammar library does not support, a pattern it cannot
  compile) fails the version with its message: no replica would take it.
- It is ready once one engine compiled it and none refused it. Replicas that were unreachable, and replicas that
  start later, compile it on its first request there (as adapters load on first use).
- When no engine answers, the task is retried (schemas.tasks); its last attempt fails the version with
  `engine_unreachable`.
- Without engines (ENGINE_URLS empty) a version is ready at once, uncompiled.

Idempotent: a version no longer pending (or deleted) is left alone; compiling twice finds the engines' cache warm.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from adapters.engine_client import compile_everywhere
from adapters.errors import TransientFailure
from schemas.models import SchemaVersion
from tenants.engine_tags import cache_salt

logger = logging.getLogger(__name__)
Status = SchemaVersion.Status
COMPILE_TIMEOUT_S = 30  # the engine bounds a compile itself; this only covers an engine that stopped answering
STALE_COMPILE = timedelta(minutes=30)  # past every retry of a task: one still pending lost its task


def schema_version_compile(*, version_id: int, final_attempt: bool = True) -> str | None:
    """Compile the version on every engine; its resulting status (None when there was nothing to do).

    Raises TransientFailure when no engine could be reached, unless ``final_attempt``."""
    version = SchemaVersion.objects.select_related("schema").filter(pk=version_id, status=Status.PENDING).first()
    if version is None:
        return None
    if not settings.ENGINE_URLS:
        return _settle(version, Status.READY)
    compiled, failures = compile_everywhere(
        settings.ENGINE_URLS, settings.ENGINE_API_KEY, {"json": version.document},
        cache_salt=cache_salt(version.schema.tenant_id), timeout=COMPILE_TIMEOUT_S)
    refusal = next((exc for exc in failures.values() if not exc.retryable), None)
    for url, exc in failures.items():
        logger.info("schema version %s not compiled on %s: %s", version_id, url, exc)
    if refusal is not None:
        return _settle(version, Status.FAILED, code=refusal.code, reason=refusal.detail)
    if compiled:
        slowest = max(float(answer.get("compile_ms") or 0.0) for answer in compiled.values())
        return _settle(version, Status.READY, warm_replicas=len(compiled), compile_ms=slowest)
    if not final_attempt:
        raise TransientFailure(f"no engine could compile schema version {version_id}: {failures}")
    return _settle(version, Status.FAILED, code="engine_unreachable",
                   reason="No engine answered to compile the schema; add the version again once they are back.")


def _settle(version: SchemaVersion, status: str, *, code: str = "", reason: str = "", warm_replicas: int = 0,
            compile_ms: float | None = None) -> str | None:
    """Record the outcome unless the version was settled (or deleted) meanwhile."""
    updated = SchemaVersion.objects.filter(pk=version.pk, status=Status.PENDING).update(
        status=status, failure_code=code[:64], failure_reason=reason[:4000], warm_replicas=warm_replicas,
        compile_ms=compile_ms, compiled_at=timezone.now() if warm_replicas else None)
    if status == Status.FAILED:
        logger.info("schema version %s failed: %s: %s", version.pk, code, reason)
    return status if updated else None


def schema_versions_recompile_stale() -> int:
    """Enqueue the compile again for versions whose task was lost (a broker outage); how many."""
    from schemas import tasks

    stale = SchemaVersion.objects.filter(status=Status.PENDING, created_at__lt=timezone.now() - STALE_COMPILE)
    ids = list(stale.values_list("pk", flat=True))
    for version_id in ids:
        tasks.schema_version_compile.delay(version_id)
    return len(ids)
