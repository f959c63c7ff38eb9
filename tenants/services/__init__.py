"""Writes: `<noun>_<verb>(*, tenant, ...)` under transaction.atomic, side effects on commit."""

from tenants.services.api_keys import api_key_create, api_key_mark_used, api_key_mark_used_async, api_key_revoke
from tenants.services.quotas import quota_set
from tenants.services.tenants import (
    invitation_accept,
    invitation_create,
    invitation_email_send,
    invitation_revoke,
    membership_add,
    membership_remove,
    membership_set_role,
    tenant_create,
    tenant_rename,
    tenant_set_status,
    user_change_password,
    user_create,
)
from tenants.services.usage import (
    retention_cutoff,
    usage_purge_raw,
    usage_record_create,
    usage_record_create_async,
    usage_records_create_async,
    usage_rollup_day,
)

__all__ = [
    "api_key_create",
    "api_key_mark_used",
    "api_key_mark_used_async",
    "api_key_revoke",
    "invitation_accept",
    "invitation_create",
    "invitation_email_send",
    "invitation_revoke",
    "membership_add",
    "membership_remove",
    "membership_set_role",
    "quota_set",
    "retention_cutoff",
    "tenant_create",
    "tenant_rename",
    "tenant_set_status",
    "usage_purge_raw",
    "usage_record_create",
    "usage_record_create_async",
    "usage_records_create_async",
    "usage_rollup_day",
    "user_change_password",
    "user_create",
]
