"""The Celery beat schedule names real tasks, and the tasks run the rollup and purge services."""

from datetime import UTC, datetime

import pytest
from django.conf import settings

from config.celery import app
from tenants import tasks
from tenants.models import UsageDaily
from tests.tenants.factories import TenantFactory, record


def test_beat_schedule_names_registered_tasks():
    app.loader.import_default_modules()
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"tenants.tasks.usage_rollup_recent", "tenants.tasks.usage_purge"} <= names  # other apps add theirs
    assert names <= set(app.tasks)


@pytest.mark.django_db
def test_rollup_of_one_day_by_iso_date_is_rerunnable():
    tenant = TenantFactory()
    today = datetime.now(UTC).date()
    record(tenant, 1, day=today, adapter="sql")
    assert tasks.usage_rollup_day.apply(args=[today.isoformat()]).get() == 1
    assert tasks.usage_rollup_day.apply(args=[today.isoformat()]).get() == 1
    assert UsageDaily.objects.get().num_requests == 1
