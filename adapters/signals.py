"""A tenant deleted by any path (the admin, a shell, a cascade) takes its adapters' objects in S3 and their copies on
engines with it: what to remove is read before the rows go, and a task removes it once the deletion commits
(adapters.tasks.tenant_objects_purge, retried while the store or engines are down; a TenantPurge row records the
work in the deletion's own transaction, so the beat sweep finishes what a lost task left)."""

from django.db import transaction
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from tenants.models import Tenant


@receiver(pre_delete, sender=Tenant, dispatch_uid="adapters.tenant_objects_purge")
def purge_a_deleted_tenants_objects(sender, instance: Tenant, **kwargs) -> None:
    from adapters import services, tasks

    record = services.tenant_purge_record(tenant_id=instance.pk)  # rolled back with the deletion, if it is
    transaction.on_commit(lambda: tasks.tenant_objects_purge.delay(record.pk), robust=True)
