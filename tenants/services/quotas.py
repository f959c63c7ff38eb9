"""Writes about quotas: operators set a tenant's overrides; every change is audited."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from tenants.effective_quota import EffectiveQuota
from tenants.key_auth import auth_generation_bump
from tenants.models import QUOTA_FIELDS, Quota, QuotaChange, Tenant


@transaction.atomic
def quota_set(*, tenant: Tenant, changes: dict[str, int | None], changed_by=None, source: str = "api") -> Quota:
    """Apply `changes` (field -> positive int, or None for the platform default; `priority_class` takes the code
    of tenants.priority); one audit row per field whose value changed. The resulting quota must be consistent
    (default_max_tokens <= max_tokens_limit, a weight of at most 1000, a known class)."""
    unknown = sorted(set(changes) - set(QUOTA_FIELDS))
    if unknown:
        raise ValidationError({"quota": f"Unknown quota fields: {', '.join(unknown)}."})
    quota, _ = Quota.objects.select_for_update().get_or_create(tenant=tenant)
    old = {name: getattr(quota, name) for name in QUOTA_FIELDS}
    new = {**old, **changes}
    try:
        EffectiveQuota.merge(settings.TENANT_QUOTA_DEFAULTS, new)
    except ValueError as exc:
        raise ValidationError({"quota": str(exc)}) from exc
    changed = [name for name in QUOTA_FIELDS if new[name] != old[name]]
    if not changed:
        return quota
    for name in changed:
        setattr(quota, name, new[name])
    quota.save(update_fields=[*changed, "updated_at"])
    QuotaChange.objects.bulk_create(
        QuotaChange(tenant=tenant, changed_by=changed_by, field=name, old_value=old[name], new_value=new[name],
                    source=source)
        for name in changed
    )
    transaction.on_commit(auth_generation_bump, robust=True)  # cached keys carry the quota: refresh them everywhere
    return quota
