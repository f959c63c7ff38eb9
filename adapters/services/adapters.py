"""Writes about adapters and versions: create, describe, soft-delete (the purge runs in Celery)."""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from adapters.errors import QuotaExceeded
from adapters.models import Adapter, AdapterUpload, AdapterVersion, name_validator
from adapters.selectors import adapter_count
from tenants.models import Tenant
from tenants.selectors import quota_effective

MAX_DESCRIPTION = 2000


def locked(queryset):
    """The rows, locked until the transaction ends: FOR NO KEY UPDATE of the model's own table only, so joins
    lock no parent rows and inserts of children (which take KEY SHARE on their parents) are not blocked.
    Every service takes its locks in one order: tenant, adapter, upload, version."""
    return queryset.select_for_update(no_key=True, of=("self",))


def lock_tenant(tenant: Tenant) -> Tenant:
    """Serialize the quota checks of one tenant (count and storage) for the rest of the transaction."""
    return locked(Tenant.objects).get(pk=tenant.pk)


def check_tenant_active(tenant: Tenant) -> None:
    if not tenant.is_active:
        raise ValidationError({"tenant": f"Tenant {tenant.slug} is suspended."})


@transaction.atomic
def adapter_create(*, tenant: Tenant, name: str, description: str = "", created_by=None) -> Adapter:
    """A new adapter without versions; refused over the tenant's `max_adapters` quota."""
    name = name.strip()
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from None
    _check_description(description)
    tenant = lock_tenant(tenant)
    check_tenant_active(tenant)
    if Adapter.objects.filter(tenant=tenant, name=name, deleted_at__isnull=True).exists():
        raise ValidationError({"name": f"An adapter named {name!r} exists."})
    limit = quota_effective(tenant=tenant).max_adapters
    count = adapter_count(tenant=tenant)
    if count >= limit:
        raise QuotaExceeded(f"The tenant has {count} adapters; its quota allows {limit}.",
                            code="adapter_quota_exceeded")
    return Adapter.objects.create(tenant=tenant, name=name, description=description, created_by=created_by)


def _check_description(description: str) -> None:
    if len(description) > MAX_DESCRIPTION:
        raise ValidationError({"description": f"At most {MAX_DESCRIPTION} characters."})


@transaction.atomic
def adapter_update(*, tenant: Tenant, adapter: Adapter, description: str) -> Adapter:
    _check_description(description)
    adapter = locked(Adapter.objects).get(pk=adapter.pk, tenant=tenant, deleted_at__isnull=True)
    adapter.description = description
    adapter.save(update_fields=["description", "updated_at"])
    return adapter


@transaction.atomic
def adapter_delete(*, tenant: Tenant, adapter: Adapter) -> None:
    """Soft-delete the adapter and all its versions now (nothing resolves them from the commit on) and abort
    its pending uploads; a Celery task then unloads them from every engine and purges their objects."""
    from adapters import tasks

    adapter = locked(Adapter.objects).get(pk=adapter.pk, tenant=tenant, deleted_at__isnull=True)
    now = timezone.now()
    adapter.deleted_at = now
    adapter.save(update_fields=["deleted_at", "updated_at"])
    AdapterVersion.objects.filter(adapter=adapter, deleted_at__isnull=True).update(deleted_at=now)
    AdapterUpload.objects.filter(adapter=adapter, status=AdapterUpload.Status.PENDING).update(
        status=AdapterUpload.Status.ABORTED, finished_at=now)
    adapter_id = adapter.pk
    transaction.on_commit(lambda: tasks.adapter_purge.delay(adapter_id), robust=True)


@transaction.atomic
def adapter_version_delete(*, tenant: Tenant, version: AdapterVersion) -> None:
    """Soft-delete one version now (the adapter's name then resolves to its newest other ready version)."""
    from adapters import tasks

    version = locked(AdapterVersion.objects).get(
        pk=version.pk, adapter__tenant=tenant, deleted_at__isnull=True)
    version.deleted_at = timezone.now()
    version.save(update_fields=["deleted_at"])
    version_id = version.pk
    transaction.on_commit(lambda: tasks.adapter_version_purge.delay(version_id), robust=True)
