"""Every management endpoint with owner, teammate, outsider, operator, a manage key, an inference key, anonymous.

The outsider (another tenant's admin) gets 404 for anything under a tenant it is not in, never 403."""

import pytest

from tenants import services
from tenants.models import Role
from tests.tenants.factories import UserFactory

CALLERS = ("owner", "teammate", "outsider", "operator", "manage_key")

# (method, path, body, expected status for each of CALLERS)
ENDPOINTS = [
    ("get", "/api/me/", None, (200, 200, 200, 200, 200)),
    ("post", "/api/auth/logout/", None, (204, 204, 204, 204, 204)),
    ("post", "/api/auth/password/", {"old_password": "x", "new_password": "y"}, (400, 400, 400, 400, 403)),
    ("get", "/api/users/", None, (403, 403, 403, 200, 403)),
    ("post", "/api/users/", {"email": "new@example.com"}, (403, 403, 403, 201, 403)),
    ("get", "/api/usage/daily/", None, (403, 403, 403, 200, 403)),
    ("get", "/api/usage/daily/export/", None, (403, 403, 403, 200, 403)),
    ("get", "/api/tenants/", None, (200, 200, 200, 200, 200)),
    ("post", "/api/tenants/", {"name": "Fresh"}, (403, 403, 403, 201, 403)),
    ("get", "/api/tenants/{slug}/", None, (200, 200, 404, 200, 200)),
    ("patch", "/api/tenants/{slug}/", {"name": "Renamed"}, (200, 403, 404, 200, 200)),
    ("post", "/api/tenants/{slug}/suspend/", None, (403, 403, 404, 200, 403)),
    ("post", "/api/tenants/{slug}/reactivate/", None, (403, 403, 404, 200, 403)),
    ("get", "/api/tenants/{slug}/quota/", None, (200, 200, 404, 200, 200)),
    ("patch", "/api/tenants/{slug}/quota/", {"requests_per_minute": 5}, (403, 403, 404, 200, 403)),
    ("get", "/api/tenants/{slug}/quota/changes/", None, (200, 403, 404, 200, 200)),
    ("get", "/api/tenants/{slug}/members/", None, (200, 200, 404, 200, 200)),
    ("post", "/api/tenants/{slug}/members/", {"email": "{spare_email}"}, (403, 403, 404, 201, 403)),
    ("patch", "/api/tenants/{slug}/members/{member}/", {"role": "admin"}, (200, 403, 404, 200, 200)),
    ("delete", "/api/tenants/{slug}/members/{member}/", None, (204, 403, 404, 204, 204)),
    ("get", "/api/tenants/{slug}/invitations/", None, (200, 403, 404, 200, 200)),
    ("post", "/api/tenants/{slug}/invitations/", {"email": "x@example.com"}, (201, 403, 404, 201, 201)),
    ("delete", "/api/tenants/{slug}/invitations/{invitation}/", None, (204, 403, 404, 204, 204)),
    ("get", "/api/tenants/{slug}/keys/", None, (200, 200, 404, 200, 200)),
    ("post", "/api/tenants/{slug}/keys/", {"name": "n", "scopes": ["inference"]}, (201, 403, 404, 201, 201)),
    ("get", "/api/tenants/{slug}/keys/{key}/", None, (200, 200, 404, 200, 200)),
    ("post", "/api/tenants/{slug}/keys/{key}/revoke/", None, (200, 403, 404, 200, 200)),
    ("get", "/api/tenants/{slug}/usage/daily/", None, (200, 200, 404, 200, 200)),
    ("get", "/api/tenants/{slug}/usage/daily/export/", None, (200, 200, 404, 200, 200)),
    ("get", "/api/tenants/{slug}/usage/summary/", None, (200, 200, 404, 200, 200)),
    ("get", "/api/tenants/{slug}/usage/requests/", None, (200, 200, 404, 200, 200)),
]


@pytest.fixture
def targets(cast):
    """The rows the paths name, all in cast.tenant."""
    member = cast.teammate.memberships.get(tenant=cast.tenant)
    invitation, _ = services.invitation_create(tenant=cast.tenant, email="i@example.com", role=Role.MEMBER,
                                               invited_by=cast.owner)
    key, _ = services.api_key_create(tenant=cast.tenant, name="target", scopes=["inference"])
    return {"slug": cast.tenant.slug, "member": member.pk, "invitation": invitation.pk, "key": key.prefix,
            "spare_email": UserFactory().email}


def _fill(value, targets):
    if isinstance(value, str):
        return value.format(**targets)
    if isinstance(value, dict):
        return {k: _fill(v, targets) for k, v in value.items()}
    return value


def _call(client, method, path, body, targets):
    return getattr(client, method)(_fill(path, targets), _fill(body, targets), format="json")


@pytest.mark.parametrize("caller_index", range(len(CALLERS)), ids=CALLERS)
@pytest.mark.parametrize(("method", "path", "body", "expected"), ENDPOINTS,
                         ids=[f"{m.upper()} {p}" for m, p, _, _ in ENDPOINTS])
def test_each_caller_gets_its_status(client_for, targets, method, path, body, expected, caller_index):
    response = _call(client_for(CALLERS[caller_index]), method, path, body, targets)
    assert response.status_code == expected[caller_index], response.content[:300]


@pytest.mark.parametrize(("method", "path", "body", "expected"), ENDPOINTS,
                         ids=[f"{m.upper()} {p}" for m, p, _, _ in ENDPOINTS])
def test_anonymous_is_401_and_inference_key_is_403(client_for, targets, method, path, body, expected):
    assert _call(client_for("anonymous"), method, path, body, targets).status_code == 401
    response = _call(client_for("inference_key"), method, path, body, targets)
    assert response.status_code == 403
    assert "manage" in response.json()["errors"][0]["detail"]


def test_outsider_sees_only_its_own_tenant_in_lists(client_for, cast):
    slugs = [t["slug"] for t in client_for("outsider").get("/api/tenants/").json()["results"]]
    assert slugs == [cast.other_tenant.slug]
    assert client_for("operator").get("/api/tenants/").json()["count"] == 2


def test_a_key_of_another_tenant_is_404_even_under_the_callers_own_slug(client_for, cast):
    theirs, _ = services.api_key_create(tenant=cast.other_tenant, name="theirs", scopes=["inference"])
    path = f"/api/tenants/{cast.tenant.slug}/keys/{theirs.prefix}/"
    assert client_for("owner").get(path).status_code == 404
    assert client_for("owner").post(path + "revoke/").status_code == 404
    theirs.refresh_from_db()
    assert not theirs.revoked


def test_a_refusal_by_role_names_the_role_it_needs(client_for, targets):
    refusals = [("teammate", "post", "/api/tenants/{slug}/keys/", "Only the tenant's admins may do this."),
                ("owner", "post", "/api/tenants/{slug}/suspend/", "Only operators may do this."),
                ("manage_key", "get", "/api/users/", "Only operators may do this.")]
    for caller, method, path, detail in refusals:
        response = _call(client_for(caller), method, path, {"name": "n", "scopes": ["inference"]}, targets)
        assert (response.status_code, response.json()["errors"][0]["detail"]) == (403, detail)
