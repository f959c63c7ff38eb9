"""No side channel between tenants through the engines' prefix cache: the gateway salts every request with its
tenant, so a tenant's repeat (API key or playground) reuses its own cached blocks and never another tenant's.
Read from the engines' own counters, not from timings."""

import pytest

from tenants.models import Role
from tests.gateway.helpers import engine_http, gateway_http, prompt_tokens, tenant_with_key
from tests.gateway.test_playground import signed_in
from tests.tenants.factories import MembershipFactory

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
BLOCK_SIZE = 16  # the stack's engines'
PROMPT = [(7 * i) % 300 + 11 for i in range(97)]  # 6 full blocks and one token to compute


def full_prefix(num_tokens: int) -> int:
    """The tokens a repeat finds cached: every full block but the last token, which is always computed."""
    return (num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def prefix_counters(stack) -> list[tuple[int, int]]:
    """(queried, hit) prompt tokens of each engine replica."""
    counters = []
    for index in range(len(stack.engine_urls)):
        with engine_http(stack, index) as engine:
            stats = engine.get("/stats").json()["prefix_cache"]
        counters.append((stats["queried_tokens"], stats["hit_tokens"]))
    return counters


def hits_of(stack, send) -> int:
    """The prefix-cache hits, over every replica, of the one request ``send()`` makes."""
    before = prefix_counters(stack)
    response = send()
    assert response.status_code == 200, response.text
    return sum(hit for _, hit in prefix_counters(stack)) - sum(hit for _, hit in before)


def on_every_replica(stack, send) -> None:
    """Send until every replica has served the request once (the base model is routed by load, ties at random)."""
    served = [False] * len(stack.engine_urls)
    for _ in range(40):
        before = prefix_counters(stack)
        assert send().status_code == 200
        after = prefix_counters(stack)
        served = [s or a[0] > b[0] for s, a, b in zip(served, after, before, strict=True)]
        if all(served):
            return
    raise AssertionError(f"replicas served: {served}")


def test_tenants_never_hit_each_others_cached_prompts_and_their_own_repeats_do(stack):
    _, acme = tenant_with_key()
    _, globex = tenant_with_key()
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1}
    with gateway_http(stack, acme) as acme_http, gateway_http(stack, globex) as globex_http:
        on_every_replica(stack, lambda: acme_http.post("/completions", json=body))
        assert hits_of(stack, lambda: globex_http.post("/completions", json=body)) == 0
        assert hits_of(stack, lambda: acme_http.post("/completions", json=body)) == full_prefix(len(PROMPT))


def test_the_playground_shares_its_tenants_cache_and_no_other(stack):
    tenant, key = tenant_with_key()
    other, _ = tenant_with_key()
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(60))}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 1}
    with gateway_http(stack, key) as api:
        on_every_replica(stack, lambda: api.post("/chat/completions", json=body))
    member = MembershipFactory(tenant=tenant, role=Role.MEMBER).user
    outsider = MembershipFactory(tenant=other, role=Role.MEMBER).user

    def playground(client, slug):
        return lambda: client.post(f"/v1/playground/{slug}/chat/completions", json=body,
                                   headers={"X-CSRFToken": client.cookies["csrftoken"]})

    with signed_in(stack, outsider) as client:
        assert hits_of(stack, playground(client, other.slug)) == 0
    with signed_in(stack, member) as client:
        expected = full_prefix(prompt_tokens(stack, {"messages": messages}))
        assert hits_of(stack, playground(client, tenant.slug)) == expected
