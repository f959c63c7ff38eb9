"""The registry's Celery wiring: the beat sweep is scheduled and registered, every task acknowledges late, and
the sweep expires abandoned uploads and re-enqueues validations that lost their task."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from adapters import services, tasks
from adapters.models import AdapterUpload, AdapterVersion
from config.celery import app
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import presigned_upload
from tests.tenants.factories import TenantFactory


def test_the_sweep_is_scheduled_and_every_task_acks_late():
    app.loader.import_default_modules()
    assert {"task": "adapters.tasks.registry_sweep", "schedule": 900} in settings.CELERY_BEAT_SCHEDULE.values()
    names = ("adapter_version_validate", "adapter_version_purge", "adapter_purge", "registry_sweep")
    assert {f"adapters.tasks.{name}" for name in names} <= set(app.tasks)
    assert all(getattr(tasks, name).acks_late for name in names)


@pytest.mark.django_db
def test_the_sweep_expires_uploads_and_revalidates_lost_versions(monkeypatch, s3, tiny_base, tiny_good_adapter):
    tenant = TenantFactory()
    adapter = services.adapter_create(tenant=tenant, name="a")
    lost = presigned_upload(tenant, adapter, [tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS])
    fresh = presigned_upload(tenant, adapter, [tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS])
    AdapterVersion.objects.filter(pk=lost.pk).update(created_at=timezone.now() - timedelta(hours=1))
    abandoned, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter, files=[{"name": "x.zip",
                                                                                              "size": 1}])
    AdapterUpload.objects.filter(pk=abandoned.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    enqueued = []
    monkeypatch.setattr(tasks.adapter_version_validate, "delay", enqueued.append)
    result = tasks.registry_sweep.apply().get()
    assert (result["expired_uploads"], result["revalidated"]) == (1, 1)
    assert enqueued == [lost.pk] and fresh.pk not in enqueued
    assert AdapterUpload.objects.get(pk=abandoned.pk).status == AdapterUpload.Status.ABORTED
