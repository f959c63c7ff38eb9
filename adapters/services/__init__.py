"""Writes of the registry: `<noun>_<verb>(*, tenant, ...)` under transaction.atomic, side effects on commit."""

from adapters.services.adapters import adapter_create, adapter_delete, adapter_update, adapter_version_delete
from adapters.services.purge import (
    adapter_purge,
    adapter_version_purge,
    registry_sweep,
    tenant_objects_purge,
    tenant_purge_record,
    upload_staging_purge,
)
from adapters.services.uploads import (
    check_upload_size,
    part_sizes,
    upload_abort,
    upload_admit,
    upload_begin_streamed,
    upload_complete,
    upload_create_presigned,
    upload_record_received,
    uploads_expire,
)
from adapters.services.validation import adapter_version_validate, adapter_versions_revalidate_stale

__all__ = [
    "adapter_create",
    "adapter_delete",
    "adapter_purge",
    "adapter_update",
    "adapter_version_delete",
    "adapter_version_purge",
    "adapter_version_validate",
    "adapter_versions_revalidate_stale",
    "check_upload_size",
    "part_sizes",
    "registry_sweep",
    "tenant_objects_purge",
    "tenant_purge_record",
    "upload_abort",
    "upload_admit",
    "upload_begin_streamed",
    "upload_complete",
    "upload_create_presigned",
    "upload_record_received",
    "upload_staging_purge",
    "uploads_expire",
]
