"""A deleted tenant takes its adapters with it: engines unload them, their objects and staged uploads leave S3
(real SeaweedFS), whatever path deleted the tenant (here the ORM, as the admin does); the beat sweep finishes what a
lost task left (never touching objects of tenants it did not delete: a bucket may be shared); and its API keys stop
working everywhere at once."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from adapters import services, tasks
from adapters.models import AdapterVersion, TenantPurge
from adapters.services import purge
from adapters.storage import object_store, staging_prefix, tenant_prefix
from tenants import services as tenant_services
from tenants.identity import AuthFailure, KeyInfo
from tenants.key_auth import KeyAuthenticator
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import keys_under, presigned_upload
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    calls = []
    monkeypatch.setattr(tasks.tenant_objects_purge, "delay", lambda *args: calls.append(args))
    return calls


def test_deleting_a_tenant_unloads_and_removes_all_it_stored(s3, tiny_base, tiny_good_adapter, sent, monkeypatch,
                                                             settings, django_capture_on_commit_callbacks):
    tenant, other = TenantFactory(), TenantFactory()
    adapter = services.adapter_create(tenant=tenant, name="a")
    files = [tiny_good_adapter / CONFIG, tiny_good_adapter / WEIGHTS]
    ready = presigned_upload(tenant, adapter, files)
    services.adapter_version_validate(version_id=ready.pk)
    ready.refresh_from_db()
    assert ready.status == AdapterVersion.Status.READY
    pending, _ = services.upload_create_presigned(tenant=tenant, adapter=adapter,
                                                  files=[{"name": "x.zip", "size": 10}])
    object_store().put_bytes(staging_prefix(pending.uuid) + "0", b"staged")  # an upload still open
    object_store().put_bytes(tenant_prefix(other.pk) + "adapters/x/v1/" + CONFIG, b"{}")
    unloaded = []
    settings.ENGINE_URLS = ["http://engine.invalid:1"]
    monkeypatch.setattr(purge, "unload_everywhere", lambda urls, key, engine_id, timeout: unloaded.append(engine_id)
                        or {})
    tenant_id = tenant.pk
    assert keys_under(tenant_prefix(tenant_id)) and keys_under(staging_prefix(pending.uuid))

    with django_capture_on_commit_callbacks(execute=True):
        tenant.delete()  # the cascade takes every row: what to remove was read before
    (args,) = sent
    record = TenantPurge.objects.get(pk=args[0])
    assert (record.tenant_id, record.engine_ids, record.upload_uuids) == (tenant_id, [ready.engine_id],
                                                                          [str(pending.uuid)])
    removed = tasks.tenant_objects_purge.apply(args=args).get()

    assert removed >= 3 and unloaded == [ready.engine_id]
    assert keys_under(tenant_prefix(tenant_id)) == [] and keys_under(staging_prefix(pending.uuid)) == []
    assert keys_under(tenant_prefix(other.pk))  # another tenant's objects stay
    assert TenantPurge.objects.get(pk=args[0]).purged_at is not None
    assert tasks.tenant_objects_purge.apply(args=args).get() == 0  # idempotent


def test_the_sweep_finishes_what_a_lost_purge_task_left_and_nothing_else(s3, sent):
    live, gone, foreign_id = TenantFactory(), TenantFactory(), 10**9  # the last: another deployment's, say
    for tenant_id in (live.pk, gone.pk, foreign_id):
        object_store().put_bytes(tenant_prefix(tenant_id) + "adapters/x/v1/" + CONFIG, b"{}")
    gone_id = gone.pk
    gone.delete()  # no commit in this test: the purge task is never sent, as if lost
    assert services.registry_sweep()["deleted_tenants"] == 0  # the task's own turn first
    TenantPurge.objects.filter(tenant_id=gone_id).update(created_at=timezone.now() - timedelta(hours=1))
    assert services.registry_sweep()["deleted_tenants"] == 1
    assert keys_under(tenant_prefix(gone_id)) == []
    assert keys_under(tenant_prefix(live.pk)) and keys_under(tenant_prefix(foreign_id))
    object_store().delete_prefix(tenant_prefix(foreign_id))


@pytest.mark.django_db(transaction=True)
def test_a_deleted_tenants_cached_keys_stop_working_at_once(redis_db, sent):
    tenant = TenantFactory()
    _, raw = tenant_services.api_key_create(tenant=tenant, name="k", scopes=["inference"])

    async def authenticate(authenticator):
        return await authenticator.authenticate(raw)

    async def scenario():
        import redis.asyncio as aioredis
        from django.conf import settings

        client = aioredis.Redis.from_url(settings.REDIS_URL)
        authenticator = KeyAuthenticator(client, ttl_s=3600)
        try:
            before = await authenticator.authenticate(raw)
            await _delete(tenant)
            return before, await authenticator.authenticate(raw)
        finally:
            await client.aclose()

    before, after = async_to_sync(scenario)()
    assert isinstance(before, KeyInfo)
    assert isinstance(after, AuthFailure) and after.status == 401


async def _delete(tenant) -> None:
    from asgiref.sync import sync_to_async

    def delete():
        with transaction.atomic():
            tenant.delete()

    await sync_to_async(delete)()
