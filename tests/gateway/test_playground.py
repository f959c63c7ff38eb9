"""The console's playground endpoint: a signed-in member's requests go through the gateway's path, count against
the tenant's quota and usage, and are marked as playground usage. Outsiders and anonymous callers are refused."""

import contextlib

import httpx
import pytest

from tenants.models import Role
from tests.gateway.helpers import GENEROUS, ready_adapter, tenant_with_key, usage_rows
from tests.tenants.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = [pytest.mark.stack, pytest.mark.django_db(transaction=True)]
MESSAGES = [{"role": "user", "content": "hello there"}]


@contextlib.contextmanager
def signed_in(stack, user):
    with httpx.Client(base_url=stack.web_url, timeout=60) as client:
        client.get("/login/")
        response = client.post("/login/", data={"username": user.username, "password": PASSWORD,
                                                "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        assert response.status_code == 302, response.text
        yield client


def chat(client: httpx.Client, slug: str, *, csrf: bool = True, **body) -> httpx.Response:
    headers = {"X-CSRFToken": client.cookies.get("csrftoken", "")} if csrf else {}
    return client.post(f"/v1/playground/{slug}/chat/completions", headers=headers,
                       json={"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "ignore_eos": True, **body})


def test_a_member_uses_the_playground_billed_to_the_tenant_and_marked(stack):
    tenant, _ = tenant_with_key(quota={**GENEROUS, "requests_per_minute": 2})
    ready_adapter(tenant, "bot")
    member = MembershipFactory(tenant=tenant, role=Role.MEMBER).user
    with signed_in(stack, member) as client:
        answer = chat(client, tenant.slug)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        assert answer.headers["x-ratelimit-remaining-requests"] == "1"  # the tenant's own quota
        streamed = chat(client, tenant.slug, stream=True, stream_options={"include_usage": True})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert chat(client, tenant.slug).status_code == 429
        models = client.get(f"/v1/playground/{tenant.slug}/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny", "bot"]
    rows = usage_rows(tenant, 2)
    assert all(r.playground and r.api_key_id is None and r.completion_tokens == 3 for r in rows)


def test_outsiders_anonymous_callers_and_forged_posts_are_refused(stack):
    tenant, _ = tenant_with_key()
    other, _ = tenant_with_key()
    outsider = MembershipFactory(tenant=other, role=Role.ADMIN).user
    with signed_in(stack, outsider) as client:
        refused = chat(client, tenant.slug)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        assert chat(client, "no-such-tenant").json() == refused.json()
        forged = chat(client, other.slug, csrf=False)  # no CSRF token: not from the console
        assert forged.status_code == 403 and forged.headers["content-type"] == "application/json"
        assert forged.json()["error"]["code"] == "csrf_failed" and forged.json()["error"]["type"] == "permission_error"
    with httpx.Client(base_url=stack.web_url, timeout=60) as anonymous:
        anonymous.get("/login/")
        assert chat(anonymous, tenant.slug).status_code == 401
    operator = UserFactory(is_staff=True)
    with signed_in(stack, operator) as client:
        assert chat(client, tenant.slug).status_code == 200  # operators reach every tenant, billed to it
    assert usage_rows(tenant, 1)[0].playground
    assert usage_rows(other, 0, timeout=0) == []
