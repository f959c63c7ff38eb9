"""Writes of the schema registry: `<noun>_<verb>(*, tenant, ...)` under transaction.atomic; each saved version's
warm compile is queued on commit (schemas.tasks)."""

from django.core.exceptions import ValidationError
from django.db import transaction

from adapters.errors import QuotaExceeded
from adapters.services.adapters import check_tenant_active, lock_tenant, locked
from schemas.documents import check_document, check_text
from schemas.models import MAX_DESCRIPTION, Schema, SchemaVersion, name_validator
from schemas.selectors import schema_count
from tenants.models import Tenant

# Each version is compiled on every engine and held in its grammar cache: a bound keeps one tenant from filling it.
MAX_SCHEMAS_PER_TENANT = 100


@transaction.atomic
def schema_create(*, tenant: Tenant, name: str, document: dict, description: str = "", strict: bool = False,
                  created_by=None) -> SchemaVersion:
    """A new schema with its version 1 (pending until the engines compiled it)."""
    try:
        name_validator(name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from None
    _check_version(document, description)
    tenant = lock_tenant(tenant)
    check_tenant_active(tenant)
    if Schema.objects.filter(tenant=tenant, name=name).exists():
        raise ValidationError({"name": f"A schema named {name!r} exists; add a version to it instead."})
    count = schema_count(tenant=tenant)
    if count >= MAX_SCHEMAS_PER_TENANT:
        raise QuotaExceeded(f"The tenant has {count} schemas; at most {MAX_SCHEMAS_PER_TENANT} are allowed.",
                            code="schema_quota_exceeded")
    schema = Schema.objects.create(tenant=tenant, name=name, created_by=created_by)
    return _add_version(schema, document, description, strict, created_by)


@transaction.atomic
def schema_version_add(*, tenant: Tenant, schema: Schema, document: dict, description: str = "",
                       strict: bool = False, created_by=None) -> SchemaVersion:
    """The schema's next version (pending until compiled); the name keeps serving its newest ready one meanwhile."""
    _check_version(document, description)
    check_tenant_active(tenant)
    schema = locked(Schema.objects).get(pk=schema.pk, tenant=tenant)
    return _add_version(schema, document, description, strict, created_by)


@transaction.atomic
def schema_delete(*, tenant: Tenant, schema: Schema) -> None:
    """Delete the schema and every version: requests naming it are refused from the commit on; the name is free."""
    locked(Schema.objects).get(pk=schema.pk, tenant=tenant).delete()


def _check_version(document, description: str) -> None:
    check_document(document)
    if len(description) > MAX_DESCRIPTION:
        raise ValidationError({"description": f"At most {MAX_DESCRIPTION} characters."})
    check_text(description, "description")


def _add_version(schema: Schema, document: dict, description: str, strict: bool, created_by) -> SchemaVersion:
    from schemas import tasks

    version = SchemaVersion.objects.create(schema=schema, number=schema.next_version, document=document,
                                           description=description, strict=strict, created_by=created_by)
    schema.next_version += 1
    schema.save(update_fields=["next_version", "updated_at"])
    transaction.on_commit(lambda: tasks.schema_version_compile.delay(version.pk), robust=True)
    return version
