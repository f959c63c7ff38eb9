"""Writes about usage: one row per inference request, daily rollups, retention of raw rows."""

from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants.models import UsageDaily, UsageRecord, UsageStatus
from tenants.selectors import usage_days_with_raw_rows
from tenants.usage_days import usage_raw_groups

_ROLLUP_FIELDS = ["num_requests", "num_errors", "num_cancelled", "prompt_tokens", "completion_tokens",
                  "latency_ms_sum", "latency_buckets"]


def _usage_row(*, request_id: str, tenant_id: int, api_key_id: str | None, adapter: str, prompt_tokens: int,
               completion_tokens: int, status: str, latency_ms: int, created_at: datetime | None,
               playground: bool = False) -> UsageRecord:
    if not request_id or len(request_id) > 100:
        raise ValueError(f"request_id must be 1 to 100 characters, got {request_id!r}")
    if status not in UsageStatus.values:
        raise ValueError(f"status must be one of {UsageStatus.values}, got {status!r}")
    for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens),
                        ("latency_ms", latency_ms)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return UsageRecord(request_id=request_id, tenant_id=tenant_id, api_key_id=api_key_id, adapter=adapter,
                       prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, status=status,
                       latency_ms=latency_ms, created_at=created_at or timezone.now(), playground=playground)


def usage_record_create(**fields) -> None:
    """Write one request's row (the fields of `usage_record_create_async`), once per request_id."""
    fields.setdefault("created_at", None)
    UsageRecord.objects.bulk_create([_usage_row(**fields)], ignore_conflicts=True)


async def usage_record_create_async(*, request_id: str, tenant_id: int, api_key_id: str | None, adapter: str,
                                    prompt_tokens: int, completion_tokens: int, status: str, latency_ms: int,
                                    created_at: datetime | None = None, playground: bool = False) -> None:
    """The gateway's write of one request's row, once per request_id (a repeat is ignored). `playground` marks
    requests from the web console's playground (no API key)."""
    row = _usage_row(request_id=request_id, tenant_id=tenant_id, api_key_id=api_key_id, adapter=adapter,
                     prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, status=status,
                     latency_ms=latency_ms, created_at=created_at, playground=playground)
    await UsageRecord.objects.abulk_create([row], ignore_conflicts=True)


async def usage_records_create_async(*, rows: list[dict]) -> None:
    """Several requests' rows (each the keyword arguments of `usage_record_create_async`) in one INSERT; a
    request_id already written is ignored. A row with a bad field refuses the whole group (ValueError)."""
    records = [_usage_row(**{"created_at": None, **fields}) for fields in rows]
    await UsageRecord.objects.abulk_create(records, ignore_conflicts=True)


def retention_cutoff(today: date | None = None) -> date:
    """Raw rows of days before this one are rolled up and deleted."""
    today = today or timezone.now().astimezone(UTC).date()
    return today - timedelta(days=settings.USAGE_RAW_RETENTION_DAYS)


def usage_rollup_day(*, day: date) -> int:
    """Rebuild the rollup rows of one UTC day from the raw rows; idempotent. Refused for days whose raw rows
    the retention has already deleted, since their rollups are all that is left."""
    if day < retention_cutoff():
        raise ValidationError({"day": f"Raw usage of {day} is past retention; its rollup is final."})
    return _rollup_day(day)


@transaction.atomic
def _rollup_day(day: date) -> int:
    rows = [
        UsageDaily(tenant_id=g["tenant_id"], day=day, adapter=g["adapter"],
                   **{name: g[name] for name in _ROLLUP_FIELDS})
        for g in usage_raw_groups(since=day, until=day)
    ]
    # An upsert, so two rollups of the same day running at once both succeed with the same result.
    UsageDaily.objects.bulk_create(rows, update_conflicts=True, unique_fields=["tenant", "day", "adapter"],
                                   update_fields=_ROLLUP_FIELDS)
    kept = Q()
    for row in rows:
        kept |= Q(tenant_id=row.tenant_id, adapter=row.adapter)
    stale = UsageDaily.objects.filter(day=day)
    (stale.exclude(kept) if rows else stale).delete()
    return len(rows)


def usage_purge_raw(*, today: date | None = None) -> int:
    """Delete raw rows older than the retention, each day rolled up just before its rows go."""
    deleted = 0
    for day in usage_days_with_raw_rows(before=retention_cutoff(today)):
        with transaction.atomic():
            _rollup_day(day)
            start = datetime.combine(day, time.min, tzinfo=UTC)
            rows = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1))
            deleted += rows.delete()[0]
    return deleted
