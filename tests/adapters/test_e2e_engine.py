"""The registry with real engines in the whole stack (``stack.engine_urls``): a version becomes ready only after a
warm load and a smoke generation on an engine; what the engine refuses fails with the engine's reason; a deleted
version is unloaded from every engine and a cold load of its purged files fails cleanly.

These need the engine server (``python -m engine serve``) in the stack fixture, with ENGINE_URLS and
ENGINE_API_KEY passed to the worker and the engine's model as the worker's base model (BASE_MODEL_CONFIG)."""

import math
import time

import httpx
import pytest

from adapters import selectors
from adapters.models import AdapterVersion
from engine.lora.format import peft_tensor_name
from tests.adapters.cases import CONFIG, WEIGHTS
from tests.adapters.helpers import leftovers
from tests.adapters.stack_client import Caller
from tests.support.peft_factory import copy_adapter, rewrite_tensors
from tests.tenants.factories import TenantFactory

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def engines(stack) -> list[httpx.Client]:
    assert stack.engine_urls, "the stack fixture has no engine yet (ENGINE_URLS is empty)"
    clients = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {stack.engine_api_key}"}, timeout=60)
               for url in stack.engine_urls]
    yield clients
    for client in clients:
        client.close()


def engine_adapter_ids(engine: httpx.Client) -> set[str]:
    adapters = engine.get("/stats").json()["adapters"]
    return {entry["id"] for entry in adapters["resident"]} | set(adapters["host_tier"])


def test_a_version_is_ready_only_after_a_warm_load_and_then_serves(stack, engines, served_good_adapter):
    caller = Caller(stack, TenantFactory())
    caller.create("warm")
    assert caller.upload_streamed("warm", [served_good_adapter / CONFIG, served_good_adapter / WEIGHTS]
                                  ).status_code == 202
    body = caller.wait("warm", [1])[1]
    assert body["status"] == "ready", (body["failure_code"], body["failure_reason"])
    assert body["warm_loaded_at"] is not None and body["warm_loaded_at"] >= body["created_at"]
    assert any(body["engine_id"] in engine_adapter_ids(engine) for engine in engines)
    served = selectors.adapter_resolve(tenant_id=caller.tenant.pk, ref="warm")
    response = engines[0].post("/v1/completions", json={"model": served.engine_id, "adapter": served.source(),
                                                         "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


def test_what_the_engine_refuses_fails_with_its_reason_and_leaves_nothing(stack, engines, served_good_adapter,
                                                                          tmp_path):
    # Valid by its header (the registry's checks pass), poisoned in its data: only a real load finds it.
    poisoned = copy_adapter(served_good_adapter, tmp_path / "nan")
    name = peft_tensor_name(0, "q_proj", "A")

    def poison(tensors):
        tensors[name].view(-1)[0] = math.nan

    rewrite_tensors(poisoned, poison)
    caller = Caller(stack, TenantFactory())
    caller.create("nan")
    assert caller.upload_streamed("nan", [poisoned / CONFIG, poisoned / WEIGHTS]).status_code == 202
    body = caller.wait("nan", [1])[1]
    assert (body["status"], body["failure_code"]) == ("failed", "non_finite_weights"), body["failure_reason"]
    assert name in body["failure_reason"]
    version = AdapterVersion.objects.get(adapter__tenant=caller.tenant, number=1)
    assert leftovers(version) == []
    assert all(version.engine_id not in engine_adapter_ids(engine) for engine in engines)


def test_a_deleted_version_is_unloaded_everywhere_and_its_cold_load_fails_cleanly(stack, engines,
                                                                                  served_good_adapter):
    caller = Caller(stack, TenantFactory())
    caller.create("bye")
    assert caller.upload_streamed("bye", [served_good_adapter / CONFIG, served_good_adapter / WEIGHTS]
                                  ).status_code == 202
    assert caller.wait("bye", [1])[1]["status"] == "ready"
    served = selectors.adapter_resolve(tenant_id=caller.tenant.pk, ref="bye")
    for engine in engines:  # every engine holds it, as after traffic
        assert engine.post("/v1/load_lora_adapter", json={"adapter": served.source()}).status_code == 200
    assert caller.http.delete(caller.base + "bye/").status_code == 204
    version = AdapterVersion.objects.get(engine_id=served.engine_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and AdapterVersion.objects.filter(pk=version.pk, purged_at=None).exists():
        time.sleep(0.2)
    assert AdapterVersion.objects.get(pk=version.pk).purged_at is not None
    assert all(served.engine_id not in engine_adapter_ids(engine) for engine in engines)
    # A request that raced the deletion (it resolved the version before) cannot bring the weights back.
    response = engines[0].post("/v1/completions", json={"model": served.engine_id, "adapter": served.source(),
                                                         "prompt": "Hello", "max_tokens": 2})
    assert response.status_code in (404, 422), response.text
    assert response.json()["error"]["code"] in ("not_found", "sha256_mismatch")
