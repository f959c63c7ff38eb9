"""Writes about API keys: create (the raw key is returned once), revoke, mark used."""

import re
from collections.abc import Iterable
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from tenants.adapter_names import ADAPTER_NAME_PATTERN
from tenants.key_auth import auth_generation_bump
from tenants.models import Scope, Tenant, TenantAPIKey
from tenants.priority import INTERACTIVE, PRIORITY_CODES

MAX_ADAPTER_NAMES = 100
_ADAPTER_NAME = re.compile(ADAPTER_NAME_PATTERN)


@transaction.atomic
def api_key_create(*, tenant: Tenant, name: str, scopes: Iterable[str], adapter_names: Iterable[str] = (),
                   expires_at: datetime | None = None, priority: str = INTERACTIVE,
                   created_by=None) -> tuple[TenantAPIKey, str]:
    """A new key and its raw value `<prefix>.<secret>`, which is not stored and cannot be shown again.
    `priority`: `batch` has the engines serve its requests after interactive ones."""
    name = name.strip()
    if not name or len(name) > 50:
        raise ValidationError({"name": "A key needs a name of 1 to 50 characters."})
    scopes = sorted(set(scopes))
    unknown = [scope for scope in scopes if scope not in Scope.values]
    if not scopes or unknown:
        raise ValidationError({"scopes": f"Scopes must be a non-empty subset of {', '.join(Scope.values)}."})
    adapter_names = sorted({adapter.strip() for adapter in adapter_names})
    if "" in adapter_names or len(adapter_names) > MAX_ADAPTER_NAMES:
        raise ValidationError({"adapter_names": f"Give up to {MAX_ADAPTER_NAMES} non-empty adapter names."})
    malformed = [adapter for adapter in adapter_names if not _ADAPTER_NAME.fullmatch(adapter)]
    if malformed:  # a name that can never match (a version, a slash) would silently refuse the key everything
        raise ValidationError({"adapter_names": f"{malformed[0]!r} is not an adapter name (letters, digits, '.', "
                                                "'_', '-'; no version: a key allowed an adapter may use all of "
                                                "its versions)."})
    if priority not in PRIORITY_CODES:
        raise ValidationError({"priority": f"A key's priority is one of {', '.join(PRIORITY_CODES)}."})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
    if not tenant.is_active:
        raise ValidationError({"tenant": f"Tenant {tenant.slug} is suspended."})
    return TenantAPIKey.objects.create_key(
        tenant=tenant, name=name, scopes=scopes, adapter_names=adapter_names, expiry_date=expires_at,
        priority=priority, created_by=created_by,
    )


@transaction.atomic
def api_key_revoke(*, tenant: Tenant, key: TenantAPIKey) -> TenantAPIKey:
    """Revoke for good; every gateway process refuses the key from its next request after the commit."""
    key = TenantAPIKey.objects.select_for_update().get(pk=key.pk, tenant=tenant)
    if not key.revoked:
        key.revoked = True
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked", "revoked_at"])
        transaction.on_commit(auth_generation_bump, robust=True)
    return key


def api_key_mark_used(*, prefix: str) -> None:
    TenantAPIKey.objects.filter(prefix=prefix).update(last_used_at=timezone.now())


async def api_key_mark_used_async(*, prefix: str) -> None:
    await TenantAPIKey.objects.filter(prefix=prefix).aupdate(last_used_at=timezone.now())
