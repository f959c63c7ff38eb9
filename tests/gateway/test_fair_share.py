"""The gateway sends each request's fair share to the engine: the tenant's opaque key, its plan's weight, and the
effective class (batch when the tenant's class or the API key says so).

In process, the pipeline runs with the real caller (the key and quota read from PostgreSQL through the key cache
and Redis) and the engine side scripted: the body it would send is captured. Through the stack, a real engine's
``/stats`` shows the tenant's opaque key among its backlogged counters while the request streams."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from gateway import pipeline
from gateway.callers import caller_from_key, caller_from_session
from gateway.errors import GatewayError
from gateway.targets import Target
from tenants import services
from tenants.engine_tags import fairness_key
from tenants.key_auth import default_authenticator
from tenants.models import Role
from tenants.priority import BATCH, INTERACTIVE, PRIORITY_CODES
from tests.gateway.helpers import GENEROUS, engine_http, openai_client, tenant_with_key, usage_rows
from tests.tenants.factories import MembershipFactory, TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)  # the gateway reads keys on its own database thread
MAX_ATTEMPTS = 5


class KeyRequest:
    def __init__(self, raw_key: str):
        self.headers = {"Authorization": f"Bearer {raw_key}"}


class SessionRequest:
    def __init__(self, user):
        self.user = user

    async def auser(self):
        return self.user


class Meter:
    async def finish(self, status):
        pass


def engine_body_for(monkeypatch, caller) -> dict:
    """The body run_generation sends to an engine for ``caller``'s chat request; the engine then refuses it."""
    sent = []

    class Pool:
        async def candidates(self, affinity_key):
            return ["replica"]

    class Upstream:
        pool = Pool()

    async def resolve_target(who, model):
        return Target(model, model, None)

    async def tokenize_prompts(upstream, candidates, bodies, model, request_id):
        return [[1, 2, 3]], 2048

    async def admit(*args):
        return Meter()

    async def open_stream(upstream, candidates, path, body, model, request_id):
        sent.append(body)
        raise GatewayError(503, "scripted engine: no stream")

    monkeypatch.setattr(pipeline, "resolve_target", resolve_target)
    monkeypatch.setattr(pipeline, "loop_upstream", Upstream)
    monkeypatch.setattr(pipeline, "tokenize_prompts", tokenize_prompts)
    monkeypatch.setattr(pipeline, "_admit", admit)
    monkeypatch.setattr(pipeline, "open_stream", open_stream)
    with pytest.raises(GatewayError):
        async_to_sync(pipeline.run_generation)(caller, "chat",
                                               b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}')
    assert len(sent) == 1
    return sent[0]


def key_caller(raw_key: str):
    return async_to_sync(caller_from_key)(KeyRequest(raw_key))


@pytest.mark.parametrize("tenant_class, key_priority, sent", [
    (INTERACTIVE, INTERACTIVE, INTERACTIVE), (INTERACTIVE, BATCH, BATCH), (BATCH, INTERACTIVE, BATCH)])
def test_the_engine_body_carries_the_plans_weight_and_the_effective_priority(monkeypatch, tenant_class,
                                                                             key_priority, sent):
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes={"fairness_weight": 6, "priority_class": PRIORITY_CODES[tenant_class]})
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"], priority=key_priority)
    body = engine_body_for(monkeypatch, key_caller(raw))
    assert (body["fairness_key"], body["fairness_weight"], body["priority"]) == (fairness_key(tenant.id), 6, sent)


def test_a_quota_change_reaches_the_next_request_of_a_cached_key(monkeypatch):
    tenant = TenantFactory()
    _, raw = services.api_key_create(tenant=tenant, name="k", scopes=["inference"])

    async def scenario():  # one event loop: one key cache, which holds the key between the two lookups
        before = await caller_from_key(KeyRequest(raw))
        num_lookups = default_authenticator().num_db_lookups
        await sync_to_async(services.quota_set)(
            tenant=tenant, changes={"fairness_weight": 250, "priority_class": PRIORITY_CODES[BATCH]})
        after = await caller_from_key(KeyRequest(raw))
        return before, after, default_authenticator().num_db_lookups - num_lookups

    before, after, num_new_lookups = async_to_sync(scenario)()
    assert num_new_lookups == 1  # the change dropped the cached entry
    assert (before.fairness_weight, before.priority) == (1, INTERACTIVE)
    body = engine_body_for(monkeypatch, after)
    assert (body["fairness_weight"], body["priority"]) == (250, BATCH)


def test_the_playground_sends_the_tenants_weight_and_class(monkeypatch):
    tenant = TenantFactory()
    member = MembershipFactory(tenant=tenant, role=Role.MEMBER).user
    services.quota_set(tenant=tenant, changes={"fairness_weight": 2, "priority_class": PRIORITY_CODES[BATCH]})
    caller = async_to_sync(caller_from_session)(SessionRequest(member), tenant.slug)
    body = engine_body_for(monkeypatch, caller)
    assert (body["fairness_key"], body["fairness_weight"], body["priority"]) == (fairness_key(tenant.id), 2, BATCH)


def backlogged_keys(stack) -> set[str]:
    keys = set()
    for index in range(len(stack.engine_urls)):
        with engine_http(stack, index) as engine:
            keys |= set(engine.get("/stats").json()["fairness"]["counters"])
    return keys


@pytest.mark.stack
def test_a_real_engine_counts_the_tenants_opaque_key_while_its_request_runs(stack):
    tenant, raw = tenant_with_key(quota={**GENEROUS, "fairness_weight": 5, "priority_class": PRIORITY_CODES[BATCH]})
    key, client = fairness_key(tenant.id), openai_client(stack, raw)
    seen: set[str] = set()
    attempts = 0
    while attempts < MAX_ATTEMPTS:  # the tiny model may finish a stream before /stats is read: try another
        attempts += 1
        stream = client.completions.create(model="tiny", prompt="a long story", max_tokens=480, stream=True,
                                           extra_body={"ignore_eos": True})
        try:
            next(iter(stream))  # the engine has admitted it: the key is backlogged until the request ends
            seen = backlogged_keys(stack)
        finally:
            stream.close()
        if key in seen:
            break
    # Each closed stream is settled by the gateway after the test's last step: its usage row written while the
    # test database was being flushed deadlocked the flush once (CI, 2026-12-05). Wait for them all.
    usage_rows(tenant, attempts)
    assert key in seen
    assert tenant.slug not in seen and str(tenant.id) not in seen  # the engine never learns who it is
