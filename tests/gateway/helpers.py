"""What the gateway's whole-stack tests share: tenants with keys and quotas, OpenAI clients on the stack's
gateway, direct engine calls (to count prompts independently), ready adapter rows, and waiting for usage rows."""

import time
import uuid

import httpx
import openai
from django.db.models import Sum

from adapters.models import Adapter, AdapterVersion
from tenants import services
from tenants.models import Scope, UsageRecord
from tests.tenants.factories import TenantFactory

GENEROUS = dict(requests_per_minute=10_000, tokens_per_minute=10_000_000, monthly_tokens=100_000_000,
                max_concurrent_requests=500)


def tenant_with_key(*, adapter_names=(), scopes=(Scope.INFERENCE,), quota: dict | None = None):
    """A new tenant, its quota overrides (``GENEROUS`` unless given), and a raw API key."""
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes=GENEROUS if quota is None else quota)
    _, raw = services.api_key_create(tenant=tenant, name="test", scopes=scopes, adapter_names=adapter_names)
    return tenant, raw


def openai_client(stack, key: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.web_url}/v1", api_key=key, max_retries=0, timeout=60, **kwargs)


def gateway_http(stack, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=f"{stack.web_url}/v1", headers=headers, timeout=60)


def engine_http(stack, index: int = 0) -> httpx.Client:
    return httpx.Client(base_url=stack.engine_urls[index], timeout=60,
                        headers={"Authorization": f"Bearer {stack.engine_api_key}"})


def prompt_tokens(stack, body: dict) -> int:
    """The engine's own count of a prompt (``{"prompt": ...}`` or ``{"messages": ...}``)."""
    return prompt_token_counts(stack, [body])[0]


def prompt_token_counts(stack, bodies: list[dict]) -> list[int]:
    with engine_http(stack) as engine:
        return [engine.post("/tokenize", json=body).json()["count"] for body in bodies]


def engine_counter(stack, name: str) -> int:
    """A request counter (``finished``, ``aborted``) summed over the stack's engines."""
    total = 0
    for index in range(len(stack.engine_urls)):
        with engine_http(stack, index) as engine:
            total += engine.get("/stats").json()["requests"][name]
    return total


def ready_adapter(tenant, name: str, number: int = 1) -> AdapterVersion:
    """A ready version in the registry's tables only (no files): enough for what never reaches an engine."""
    adapter, _ = Adapter.objects.get_or_create(tenant=tenant, name=name, deleted_at=None)
    return AdapterVersion.objects.create(
        adapter=adapter, number=number, engine_id=f"adp_{uuid.uuid4().hex}_v{number}", status="ready",
        storage_prefix=f"tenants/{tenant.pk}/adapters/{adapter.uuid}/v{number}/", upload_bytes=1, sha256="0" * 64)


def usage_rows(tenant, count: int, timeout: float = 30):
    """The tenant's usage rows once there are ``count`` of them (they are written as requests end)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = list(UsageRecord.objects.filter(tenant=tenant).order_by("id"))
        if len(rows) >= count or time.monotonic() > deadline:
            assert len(rows) == count, f"{len(rows)} usage rows, expected {count}"
            return rows
        time.sleep(0.05)


def usage_sums(tenant) -> tuple[int, int]:
    sums = UsageRecord.objects.filter(tenant=tenant).aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    return sums["p"] or 0, sums["c"] or 0
