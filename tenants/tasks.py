"""Celery tasks (thin: the work is in tenants.services). The usage ones are scheduled by CELERY_BEAT_SCHEDULE in
settings."""

import smtplib
from datetime import date, timedelta

from celery import shared_task
from django.utils import timezone

from tenants import services


@shared_task
def usage_rollup_day(day_iso: str) -> int:
    """Rebuild one UTC day's rollups (idempotent; re-run it for a day after late rows)."""
    return services.usage_rollup_day(day=date.fromisoformat(day_iso))


@shared_task
def usage_rollup_recent() -> int:
    """Yesterday (late rows) and today so far: the beat entry, every USAGE_ROLLUP_INTERVAL_S."""
    today = timezone.now().date()
    return sum(services.usage_rollup_day(day=day) for day in (today - timedelta(days=1), today))


@shared_task
def usage_purge() -> int:
    """Delete raw rows past USAGE_RAW_RETENTION_DAYS, each day rolled up first."""
    return services.usage_purge_raw()


@shared_task(bind=True, acks_late=True, max_retries=5)
def invitation_email(self, invitation_id: int, link: str) -> bool:
    """Email an invitation's link; retried with backoff while the mail server is unreachable or refuses."""
    try:
        return services.invitation_email_send(invitation_id=invitation_id, link=link)
    except (smtplib.SMTPException, OSError) as exc:
        raise self.retry(exc=exc, countdown=min(300, 10 * 2 ** self.request.retries)) from exc
