"""Reads of the registry. Every selector takes the tenant; another tenant's rows are simply not found.

For the gateway: :func:`adapter_resolve_async` (and :func:`adapter_resolve`) maps ``name`` or ``name:version``
to the :class:`ServableAdapter` an engine request needs, or None when nothing ready answers to it.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Max, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from adapters.models import Adapter, AdapterUpload, AdapterVersion
from adapters.refs import parse_adapter_ref
from adapters.storage import version_uri
from tenants.models import Tenant

READY = AdapterVersion.Status.READY


@dataclass(frozen=True, slots=True)
class ServableAdapter:
    """What the gateway needs to route a request to a ready adapter version."""

    name: str
    version: int
    engine_id: str  # the engine's `model` for this adapter
    uri: str  # s3://bucket/tenants/<t>/adapters/<uuid>/v<n>/
    sha256: str

    def source(self) -> dict:
        """The ``"adapter"`` field of an engine request (ENGINE_PROTOCOL.md)."""
        return {"id": self.engine_id, "uri": self.uri, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class ReadyAdapter:
    """An adapter a tenant can call by name: it has a ready version."""

    name: str
    latest_version: int
    created_at: datetime


def adapter_list(*, tenant: Tenant) -> QuerySet[Adapter]:
    """The tenant's live adapters, each with `latest_version` (newest ready number or None) and `num_versions`."""
    live_versions = Q(versions__deleted_at__isnull=True)
    return (
        Adapter.objects.filter(tenant=tenant, deleted_at__isnull=True)
        .select_related("created_by")
        .annotate(latest_version=Max("versions__number", filter=live_versions & Q(versions__status=READY)),
                  num_versions=Count("versions", filter=live_versions))
        .order_by("name", "id")
    )


def adapter_overview_list(*, tenant: Tenant) -> QuerySet[Adapter]:
    """:func:`adapter_list` plus what a listing shows: the newest live version's `newest_number` and
    `newest_status` (None without versions) and `stored_bytes` (what its versions are charged, as
    :func:`adapter_storage_used` counts them)."""
    newest = AdapterVersion.objects.filter(adapter=OuterRef("pk"), deleted_at__isnull=True).order_by("-number")
    charged = Q(versions__deleted_at__isnull=True) & ~Q(versions__status=AdapterVersion.Status.FAILED)
    return adapter_list(tenant=tenant).annotate(
        newest_number=Subquery(newest.values("number")[:1]),
        newest_status=Subquery(newest.values("status")[:1]),
        stored_bytes=Coalesce(Sum(Coalesce("versions__size_bytes", "versions__upload_bytes"), filter=charged), 0),
    )


def adapter_get(*, tenant: Tenant, name: str) -> Adapter:
    """The tenant's live adapter of this name; Adapter.DoesNotExist otherwise."""
    return adapter_list(tenant=tenant).get(name=name)


def adapter_count(*, tenant: Tenant) -> int:
    return Adapter.objects.filter(tenant=tenant, deleted_at__isnull=True).count()


def adapter_version_list(*, tenant: Tenant, adapter: Adapter) -> QuerySet[AdapterVersion]:
    return (AdapterVersion.objects.filter(adapter=adapter, adapter__tenant=tenant, deleted_at__isnull=True)
            .select_related("created_by").order_by("-number"))


def adapter_version_get(*, tenant: Tenant, adapter: Adapter, number: int) -> AdapterVersion:
    return adapter_version_list(tenant=tenant, adapter=adapter).get(number=number)


def adapter_upload_get(*, tenant: Tenant, adapter: Adapter, upload_uuid) -> AdapterUpload:
    return AdapterUpload.objects.select_related("version").get(tenant=tenant, adapter=adapter, uuid=upload_uuid)


def adapter_storage_used(*, tenant: Tenant, exclude_version_id: int | None = None) -> int:
    """Bytes the tenant's quota is charged for: live versions that did not fail (their normalized size, or the
    uploaded size until validated) plus the declared size of pending, unexpired uploads."""
    versions = AdapterVersion.objects.filter(
        adapter__tenant=tenant, adapter__deleted_at__isnull=True, deleted_at__isnull=True,
    ).exclude(status=AdapterVersion.Status.FAILED)
    if exclude_version_id is not None:
        versions = versions.exclude(pk=exclude_version_id)
    stored = versions.aggregate(total=Sum(Coalesce("size_bytes", "upload_bytes")))["total"] or 0
    pending = AdapterUpload.objects.filter(
        tenant=tenant, status=AdapterUpload.Status.PENDING, expires_at__gt=timezone.now(),
    ).aggregate(total=Sum("declared_bytes"))["total"] or 0
    return stored + pending


def _servable(tenant_id: int, ref: str) -> QuerySet[AdapterVersion]:
    parsed = parse_adapter_ref(ref)
    versions = AdapterVersion.objects.filter(
        adapter__tenant_id=tenant_id, adapter__name=parsed.name, adapter__deleted_at__isnull=True,
        deleted_at__isnull=True, status=READY,
    ).select_related("adapter")
    if parsed.version is not None:
        versions = versions.filter(number=parsed.version)
    return versions.order_by("-number")


def _as_servable(version: AdapterVersion | None) -> ServableAdapter | None:
    if version is None:
        return None
    return ServableAdapter(name=version.adapter.name, version=version.number, engine_id=version.engine_id,
                           uri=version_uri(version.storage_prefix), sha256=version.sha256)


def adapter_resolve(*, tenant_id: int, ref: str) -> ServableAdapter | None:
    """``name`` -> its newest ready version, ``name:N`` -> version N if ready; None if not found, not ready or
    deleted. ValueError for a malformed reference."""
    return _as_servable(_servable(tenant_id, ref).first())


async def adapter_ready_list_async(*, tenant_id: int) -> list[ReadyAdapter]:
    """The tenant's live adapters that have a ready version (what ``GET /v1/models`` lists), by name."""
    ready = Q(versions__status=READY, versions__deleted_at__isnull=True)
    rows = (Adapter.objects.filter(tenant_id=tenant_id, deleted_at__isnull=True).filter(ready)
            .annotate(latest_version=Max("versions__number", filter=ready))
            .values_list("name", "latest_version", "created_at").order_by("name"))
    return [ReadyAdapter(name, version, created) async for name, version, created in rows]


async def adapter_resolve_async(*, tenant_id: int, ref: str) -> ServableAdapter | None:
    """:func:`adapter_resolve` for async code (the gateway)."""
    return _as_servable(await _servable(tenant_id, ref).afirst())


def adapter_versions_by_engine_id(*, engine_ids: list[str]) -> dict[str, AdapterVersion]:
    """Operators only (every tenant): engine id -> its version, with adapter and tenant, deleted ones included
    (an engine may still hold a version deleted a moment ago). Ids no version has are left out."""
    versions = AdapterVersion.objects.filter(engine_id__in=set(engine_ids)).select_related("adapter__tenant")
    return {version.engine_id: version for version in versions}
