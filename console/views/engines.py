"""Operators' view of the engine replicas: health, queue, KV-cache use, the adapters each holds (named by tenant
and adapter) and the adapter-slot hit rate, from each replica's /stats; htmx refreshes it every few seconds."""

from asgiref.sync import sync_to_async
from django.conf import settings

from adapters import selectors as adapter_selectors
from console import engine_status
from console.views.common import render_page
from tenants.access import operator_required

REFRESH_S = 5


@operator_required
async def engines(request):
    replicas = await engine_status.fleet_status(settings.ENGINE_URLS, settings.ENGINE_API_KEY)
    await sync_to_async(name_adapters)(replicas)
    up = [replica for replica in replicas if replica.state == engine_status.UP]
    context = {
        "replicas": replicas,
        "num_up": len(up),
        "running": sum(replica.running for replica in up),
        "waiting": sum(replica.waiting for replica in up),
        "num_resident": sum(len(replica.resident) for replica in up),
        "num_slots": sum(replica.slots for replica in up),
        "refresh_s": REFRESH_S,
    }
    return await sync_to_async(render_page)(request, "console/operator/engines.html", context,
                                            nav="operator-engines")


def name_adapters(replicas: list[engine_status.ReplicaStatus]) -> None:
    """Put the tenant and adapter behind each engine id the replicas hold (engines only know the opaque ids)."""
    held = [adapter for replica in replicas for adapter in replica.adapters()]
    versions = adapter_selectors.adapter_versions_by_engine_id(engine_ids=[adapter.engine_id for adapter in held])
    for adapter in held:
        version = versions.get(adapter.engine_id)
        if version is not None:
            tenant = version.adapter.tenant
            adapter.tenant_name, adapter.tenant_slug = tenant.name, tenant.slug
            adapter.adapter_name, adapter.version = version.adapter.name, version.number
            adapter.deleted = version.deleted_at is not None
