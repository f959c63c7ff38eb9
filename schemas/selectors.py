"""Reads of the schema registry. Every selector takes the tenant; another tenant's rows are simply not found.

For the gateway: :func:`schema_resolve_async` maps a name (and an optional pinned version) to what a request
sends the engine inline.
"""

from dataclasses import dataclass

from django.db.models import Count, Max, OuterRef, Q, QuerySet, Subquery

from schemas.models import Schema, SchemaVersion

READY, PENDING, FAILED = SchemaVersion.Status.READY, SchemaVersion.Status.PENDING, SchemaVersion.Status.FAILED


@dataclass(frozen=True, slots=True)
class ResolvedSchema:
    """The version a request's ``json_schema.name`` (and ``version``) names."""

    name: str
    version: int
    document: dict
    strict: bool
    description: str
    status: str
    failure_reason: str


def schema_list(*, tenant) -> QuerySet[Schema]:
    """The tenant's schemas, each with `latest_version` (newest ready number or None), `num_versions`, and the
    newest version's `newest_number` and `newest_status`."""
    newest = SchemaVersion.objects.filter(schema=OuterRef("pk")).order_by("-number")
    return (
        Schema.objects.filter(tenant=tenant).select_related("created_by")
        .annotate(latest_version=Max("versions__number", filter=Q(versions__status=READY)),
                  num_versions=Count("versions"),
                  newest_number=Subquery(newest.values("number")[:1]),
                  newest_status=Subquery(newest.values("status")[:1]))
        .order_by("name", "id")
    )


def schema_get(*, tenant, name: str) -> Schema:
    """The tenant's schema of this name; Schema.DoesNotExist otherwise."""
    return schema_list(tenant=tenant).get(name=name)


def schema_count(*, tenant) -> int:
    return Schema.objects.filter(tenant=tenant).count()


def schema_version_list(*, tenant, schema: Schema) -> QuerySet[SchemaVersion]:
    return (SchemaVersion.objects.filter(schema=schema, schema__tenant=tenant)
            .select_related("created_by").order_by("-number"))


def schema_version_get(*, tenant, schema: Schema, number: int) -> SchemaVersion:
    return schema_version_list(tenant=tenant, schema=schema).get(number=number)


def pick_version(versions: list[SchemaVersion], pinned: int | None) -> SchemaVersion | None:
    """What a name serves: the pinned number whatever its status; else the newest ready version, else the newest
    pending one (the engine then compiles it in the request), else the newest (failed) one, so that the caller
    learns why. ``versions`` come newest first."""
    if pinned is not None:
        return next((v for v in versions if v.number == pinned), None)
    for status in (READY, PENDING, FAILED):
        found = next((v for v in versions if v.status == status), None)
        if found is not None:
            return found
    return None


async def schema_resolve_async(*, tenant_id: int, name: str, version: int | None = None) -> ResolvedSchema | None:
    """The version ``name`` (or ``name`` pinned to ``version``) serves in the tenant, with its status; None when
    the tenant has no such schema or version."""
    rows = SchemaVersion.objects.filter(schema__tenant_id=tenant_id, schema__name=name).order_by("-number")
    if version is not None:
        rows = rows.filter(number=version)
    else:  # the newest of each status is all pick_version looks at
        rows = rows.filter(number__in=Subquery(
            SchemaVersion.objects.filter(schema=OuterRef("schema")).values("status")
            .annotate(newest=Max("number")).values("newest")))
    found = pick_version([v async for v in rows.only(
        "number", "document", "strict", "description", "status", "failure_reason")], version)
    if found is None:
        return None
    return ResolvedSchema(name, found.number, found.document, found.strict, found.description, found.status,
                          found.failure_reason)
