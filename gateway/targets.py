"""What a request's ``model`` names, looked up within the caller's tenant only.

``model`` is the base model's name, an adapter's name (its newest ready version) or ``name:version``. Anything
else (a name of another tenant, an engine's opaque adapter id, a deleted or unready adapter, an adapter outside
the key's restriction, a malformed name) is the same 404, so a caller cannot tell "exists elsewhere" from "never
existed".
"""

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from adapters.refs import parse_adapter_ref
from adapters.selectors import ServableAdapter, adapter_ready_list_async, adapter_resolve_async
from gateway.callers import Caller
from gateway.errors import model_not_found
from tenants.db_thread import on_db_thread


@dataclass(frozen=True, slots=True)
class Target:
    model: str  # as the client named it (echoed back in responses)
    engine_model: str  # what the engine is asked for: its served base name or the adapter's opaque id
    adapter: ServableAdapter | None

    @property
    def usage_name(self) -> str:
        """The usage row's adapter column: the adapter's name, "" for the base model."""
        return self.adapter.name if self.adapter else ""

    @property
    def affinity_key(self) -> str | None:
        """What replicas are chosen by (rendezvous hashing): the adapter version, None for the base model."""
        return self.adapter.engine_id if self.adapter else None


async def resolve_target(caller: Caller, model: str) -> Target:
    if model == settings.BASE_MODEL_NAME:
        return Target(model, model, None)
    try:
        ref = parse_adapter_ref(model)
    except ValueError:
        raise model_not_found(model) from None
    if not caller.allows_adapter(ref.name):
        raise model_not_found(model)
    adapter = await on_db_thread(adapter_resolve_async, tenant_id=caller.tenant.id, ref=model)
    if adapter is None:
        raise model_not_found(model)
    return Target(model, adapter.engine_id, adapter)


def _model_object(model_id: str, created: datetime | int, owned_by: str, parent: str | None = None) -> dict:
    created_s = created if isinstance(created, int) else int(created.timestamp())
    entry = {"id": model_id, "object": "model", "created": created_s, "owned_by": owned_by}
    if parent is not None:
        entry["parent"] = parent
    return entry


def base_model_object() -> dict:
    return _model_object(settings.BASE_MODEL_NAME, 0, "system")


async def model_list(caller: Caller) -> list[dict]:
    """The base model and the caller's ready adapters (those the key may use), in OpenAI's model shape."""
    adapters = await on_db_thread(adapter_ready_list_async, tenant_id=caller.tenant.id)
    return [base_model_object()] + [
        _model_object(a.name, a.created_at, caller.tenant.slug, settings.BASE_MODEL_NAME)
        for a in adapters if caller.allows_adapter(a.name)
    ]


async def model_detail(caller: Caller, model: str) -> dict:
    target = await resolve_target(caller, model)
    if target.adapter is None:
        return base_model_object()
    adapters = {a.name: a for a in await on_db_thread(adapter_ready_list_async, tenant_id=caller.tenant.id)}
    created = adapters[target.adapter.name].created_at if target.adapter.name in adapters else 0
    return _model_object(model, created, caller.tenant.slug, settings.BASE_MODEL_NAME)
