"""What the management API does beyond access: shown-once secrets, key auth, sessions, errors, usage, quotas."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from tenants import services
from tenants.models import QuotaChange, Tenant, TenantAPIKey, UsageDaily
from tests.tenants.factories import PASSWORD


def test_key_secret_is_shown_once_and_then_works_as_a_manage_key(client_for, cast):
    owner = client_for("owner")
    created = owner.post(f"/api/tenants/{cast.tenant.slug}/keys/",
                         {"name": "ci", "scopes": ["manage"], "adapter_names": ["sql"]}, format="json").json()
    assert created["key"].startswith(created["prefix"] + ".") and created["adapter_names"] == ["sql"]
    listed = owner.get(f"/api/tenants/{cast.tenant.slug}/keys/").json()["results"]
    assert [k["prefix"] for k in listed] == [created["prefix"]] and all("key" not in k for k in listed)
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {created['key']}")
    assert script.get(f"/api/tenants/{cast.tenant.slug}/members/").status_code == 200
    assert script.get(f"/api/tenants/{cast.other_tenant.slug}/").status_code == 404
    assert TenantAPIKey.objects.get(prefix=created["prefix"]).created_by == cast.owner


def test_revoked_and_expired_manage_keys_are_refused_at_once(cast):
    key, raw = services.api_key_create(tenant=cast.tenant, name="k", scopes=["manage"])
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert script.get("/api/me/").status_code == 200
    services.api_key_revoke(tenant=cast.tenant, key=key)
    response = script.get("/api/me/")
    assert response.status_code == 401 and "revoked" in response.json()["errors"][0]["detail"]
    expiring, raw2 = services.api_key_create(tenant=cast.tenant, name="k2", scopes=["manage"],
                                             expires_at=datetime.now(UTC) + timedelta(hours=1))
    TenantAPIKey.objects.filter(pk=expiring.pk).update(expiry_date=datetime.now(UTC) - timedelta(seconds=1))
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {raw2}")
    assert script.get("/api/me/").status_code == 401


def test_suspended_tenants_keys_are_refused_and_operators_can_reactivate(client_for, cast):
    _, raw = services.api_key_create(tenant=cast.tenant, name="k", scopes=["manage"])
    operator = client_for("operator")
    assert operator.post(f"/api/tenants/{cast.tenant.slug}/suspend/").json()["status"] == "suspended"
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert script.get("/api/me/").status_code == 403
    assert operator.post(f"/api/tenants/{cast.tenant.slug}/reactivate/").json()["status"] == "active"
    assert script.get("/api/me/").status_code == 200


def test_session_login_me_and_csrf(cast):
    client = APIClient(enforce_csrf_checks=True)
    bad = client.post("/api/auth/login/", {"email": cast.owner.email, "password": "wrong"}, format="json")
    assert bad.status_code == 400
    assert client.post("/api/auth/login/", {"email": cast.owner.email, "password": PASSWORD},
                       format="json").status_code == 200
    me = client.get("/api/me/").json()
    assert me["user"]["email"] == cast.owner.email
    assert me["memberships"] == [{"tenant": cast.tenant.slug, "name": cast.tenant.name, "role": "admin"}]
    # A session write without the CSRF token is refused (the browser UI sends it).
    assert client.post(f"/api/tenants/{cast.tenant.slug}/keys/", {"name": "n", "scopes": ["inference"]},
                       format="json").status_code == 403


def test_password_change_keeps_the_session(client_for, cast):
    client = APIClient()
    client.login(username=cast.owner.username, password=PASSWORD)
    response = client.post("/api/auth/password/", {"old_password": PASSWORD, "new_password": "new-long-password-1"},
                           format="json")
    assert response.status_code == 204
    assert client.get("/api/me/").status_code == 200
    cast.owner.refresh_from_db()
    assert cast.owner.check_password("new-long-password-1")


def test_validation_errors_have_the_standard_shape(client_for, cast):
    response = client_for("owner").post(f"/api/tenants/{cast.tenant.slug}/keys/", {"name": "", "scopes": ["root"]},
                                        format="json")
    body = response.json()
    assert response.status_code == 400 and body["type"] == "validation_error"
    assert {error["attr"] for error in body["errors"]} >= {"name", "scopes.0"}


def test_service_rule_errors_are_400_too(client_for, cast):
    member = cast.owner.memberships.get(tenant=cast.tenant)
    response = client_for("owner").patch(f"/api/tenants/{cast.tenant.slug}/members/{member.pk}/", {"role": "member"},
                                         format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["detail"] == "A tenant keeps at least one admin."


def test_invitation_flow_over_the_api(client_for, cast):
    created = client_for("owner").post(f"/api/tenants/{cast.tenant.slug}/invitations/",
                                       {"email": "joiner@example.com", "role": "member"}, format="json").json()
    listed = client_for("owner").get(f"/api/tenants/{cast.tenant.slug}/invitations/").json()["results"]
    assert "token" not in listed[0]
    joined = APIClient().post("/api/invitations/accept/", {"token": created["token"], "password": PASSWORD},
                              format="json")
    assert joined.status_code == 201 and joined.json()["email"] == "joiner@example.com"
    again = APIClient().post("/api/invitations/accept/", {"token": created["token"], "password": PASSWORD},
                             format="json")
    assert again.status_code == 400


def test_operator_sets_quota_with_audit_and_null_restores_default(client_for, cast, settings):
    operator = client_for("operator")
    url = f"/api/tenants/{cast.tenant.slug}/quota/"
    body = operator.patch(url, {"requests_per_minute": 7, "monthly_tokens": 1000}, format="json").json()
    assert body["effective"]["requests_per_minute"] == 7 and body["overrides"]["monthly_tokens"] == 1000
    body = operator.patch(url, {"monthly_tokens": None}, format="json").json()
    assert body["effective"]["monthly_tokens"] == settings.TENANT_QUOTA_DEFAULTS["monthly_tokens"]
    changes = client_for("owner").get(url + "changes/").json()["results"]
    assert [(c["field"], c["old_value"], c["new_value"], c["changed_by"]) for c in changes] == [
        ("monthly_tokens", 1000, None, cast.operator.email),
        ("monthly_tokens", None, 1000, cast.operator.email),
        ("requests_per_minute", None, 7, cast.operator.email),
    ]
    assert QuotaChange.objects.filter(tenant=cast.tenant).count() == 3
    bad = operator.patch(url, {"requests_per_minute": 0, "tokens_per_minute": 2**70}, format="json")
    assert bad.status_code == 400 and len(bad.json()["errors"]) == 2


def _usage(tenant, day, adapter, requests):
    UsageDaily.objects.create(tenant=tenant, day=day, adapter=adapter, num_requests=requests,
                              prompt_tokens=10 * requests, completion_tokens=requests, latency_ms_sum=100 * requests,
                              latency_buckets=[0, 0, requests] + [0] * 9)


@pytest.fixture
def usage_rows(cast):
    today = datetime.now(UTC).date()
    for days_ago in range(5):
        _usage(cast.tenant, today - timedelta(days=days_ago), "sql", days_ago + 1)
        _usage(cast.tenant, today - timedelta(days=days_ago), "", 1)
    _usage(cast.other_tenant, today, "sql", 100)
    return today


def test_usage_by_day_and_adapter_with_range(client_for, cast, usage_rows):
    since = (usage_rows - timedelta(days=1)).isoformat()
    rows = client_for("teammate").get(f"/api/tenants/{cast.tenant.slug}/usage/daily/",
                                      {"since": since, "adapter": "sql"}).json()["results"]
    assert [(r["day"], r["num_requests"]) for r in rows] == [(usage_rows.isoformat(), 1), (since, 2)]
    assert rows[0]["latency_ms_p50"] == pytest.approx(75.0)
    summary = client_for("teammate").get(f"/api/tenants/{cast.tenant.slug}/usage/summary/").json()
    assert summary["num_requests"] == 15 + 5 and summary["prompt_tokens"] == 200


def test_usage_csv_export(client_for, cast, usage_rows):
    response = client_for("owner").get(f"/api/tenants/{cast.tenant.slug}/usage/daily/export/", {"adapter": "sql"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 5 and {row["tenant"] for row in rows} == {cast.tenant.slug}
    assert sum(int(row["num_requests"]) for row in rows) == 15


def test_operator_usage_across_tenants_filters_by_tenant(client_for, cast, usage_rows):
    everything = client_for("operator").get("/api/usage/daily/").json()
    assert everything["count"] == 11
    theirs = client_for("operator").get("/api/usage/daily/", {"tenant": cast.other_tenant.slug}).json()
    assert [(r["tenant"], r["num_requests"]) for r in theirs["results"]] == [(cast.other_tenant.slug, 100)]


def test_pagination_bounds(client_for, cast, usage_rows):
    page = client_for("owner").get(f"/api/tenants/{cast.tenant.slug}/usage/daily/", {"limit": 3, "offset": 9}).json()
    assert page["count"] == 10 and len(page["results"]) == 1
    huge = client_for("owner").get(f"/api/tenants/{cast.tenant.slug}/usage/daily/", {"offset": 10**30})
    assert huge.status_code == 200 and huge.json()["results"] == []


def test_operator_creates_tenant_account_and_membership(client_for):
    operator = client_for("operator")
    tenant = operator.post("/api/tenants/", {"name": "New Co"}, format="json").json()
    user = operator.post("/api/users/", {"email": "boss@new.co", "password": PASSWORD}, format="json").json()
    member = operator.post(f"/api/tenants/{tenant['slug']}/members/", {"email": "boss@new.co", "role": "admin"},
                           format="json")
    assert member.status_code == 201 and member.json()["user"] == user["id"]
    assert Tenant.objects.get(slug="new-co").memberships.get().role == "admin"
    unknown = operator.post(f"/api/tenants/{tenant['slug']}/members/", {"email": "ghost@new.co"}, format="json")
    assert unknown.status_code == 400


def test_a_person_in_two_tenants_sees_both(cast):
    other_admin = cast.outsider
    services.membership_add(tenant=cast.tenant, user=other_admin, role="member")
    client = APIClient()
    client.force_authenticate(other_admin)
    assert {t["slug"] for t in client.get("/api/tenants/").json()["results"]} == {cast.tenant.slug,
                                                                                 cast.other_tenant.slug}
    assert client.patch(f"/api/tenants/{cast.tenant.slug}/", {"name": "x"}, format="json").status_code == 403
    assert client.patch(f"/api/tenants/{cast.other_tenant.slug}/", {"name": "x"}, format="json").status_code == 200


def test_schema_and_docs_are_served():
    client = APIClient()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/tenants/{slug}/keys/" in paths and "/api/tenants/{slug}/usage/daily/export/" in paths
    assert client.get("/api/docs/").status_code == 200
    assert schema.json()["components"]["securitySchemes"]["manageKey"]["scheme"] == "bearer"


def test_empty_adapter_means_the_base_model_in_every_usage_view(client_for, cast, usage_rows):
    base = f"/api/tenants/{cast.tenant.slug}"
    owner = client_for("owner")
    daily = owner.get(f"{base}/usage/daily/", {"adapter": ""}).json()
    assert daily["count"] == 5 and {r["adapter"] for r in daily["results"]} == {""}
    assert owner.get(f"{base}/usage/summary/", {"adapter": ""}).json()["num_requests"] == 5
    assert owner.get(f"{base}/usage/summary/").json()["num_requests"] == 20  # absent: every adapter
    export = owner.get(f"{base}/usage/daily/export/", {"adapter": ""})
    assert {row["adapter"] for row in csv.DictReader(io.StringIO(export.content.decode()))} == {""}


def test_filters_refuse_values_they_cannot_apply(client_for, cast, usage_rows):
    base = f"/api/tenants/{cast.tenant.slug}"
    owner = client_for("owner")
    services.api_key_create(tenant=cast.tenant, name="k", scopes=["manage"])
    assert owner.get(f"{base}/keys/", {"revoked": "maybe"}).status_code == 400
    assert owner.get(f"{base}/keys/", {"revoked": "false"}).json()["count"] == 1
    assert owner.get(f"{base}/keys/", {"revoked": "true"}).json()["count"] == 0
    today = usage_rows.isoformat()
    backwards = owner.get(f"{base}/usage/daily/", {"since": today, "until": "2000-01-01"})
    assert backwards.status_code == 400 and backwards.json()["errors"][0]["attr"] == "until"
    assert owner.get(f"{base}/usage/requests/", {"since": "2030-01-01T00:00:00Z",
                                                 "until": "2029-01-01T00:00:00Z"}).status_code == 400
    assert owner.get(f"{base}/usage/daily/", {"since": today, "until": today}).json()["count"] == 2


def test_an_empty_export_still_has_its_header_row(client_for, cast):
    response = client_for("owner").get(f"/api/tenants/{cast.tenant.slug}/usage/daily/export/")
    header = response.content.decode().splitlines()
    assert len(header) == 1 and "num_requests" in header[0].split(",")


def test_quota_changes_name_only_known_fields(client_for, cast):
    response = client_for("operator").patch(f"/api/tenants/{cast.tenant.slug}/quota/", {"max_adaptrs": 3},
                                            format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["attr"] == "max_adaptrs"
    assert QuotaChange.objects.filter(tenant=cast.tenant).count() == 0


def test_key_allow_lists_take_adapter_names_only(client_for, cast):
    owner = client_for("owner")
    for bad in ("sql:1", "a/b", "ü", "-x"):
        response = owner.post(f"/api/tenants/{cast.tenant.slug}/keys/",
                              {"name": "p", "scopes": ["inference"], "adapter_names": ["ok", bad]}, format="json")
        assert response.status_code == 400 and response.json()["errors"][0]["attr"] == "adapter_names", bad
    assert owner.post(f"/api/tenants/{cast.tenant.slug}/keys/", {"name": "p", "scopes": ["inference"],
                      "adapter_names": ["sql-v2.1_x"]}, format="json").status_code == 201


def test_over_long_emails_are_400s(client_for, cast):
    operator = client_for("operator")
    long_email = "a" * 170 + "@a.example"
    response = operator.post("/api/users/", {"email": long_email}, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["attr"] == "email"
    invite = client_for("owner").post(f"/api/tenants/{cast.tenant.slug}/invitations/",
                                      {"email": "b" * 300 + "@x.example"}, format="json")
    assert invite.status_code == 400


def test_unknown_paths_under_api_are_json_404s(client_for, cast):
    for path in (f"/api/tenants/{cast.tenant.slug}/keys/ABCDEFGHX/revoke/", "/api/nothing/here/"):
        for method in ("get", "post", "delete"):
            response = getattr(client_for("owner"), method)(path)
            assert response.status_code == 404 and response["Content-Type"].startswith("application/json")
            assert response.json()["errors"][0]["code"] == "not_found"


def test_the_schema_documents_the_403s_and_inputs_the_api_answers(client_for, cast):
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    paths = schema["paths"]
    for path, method in (("/api/tenants/{slug}/quota/", "patch"), ("/api/tenants/{slug}/keys/", "post"),
                         ("/api/usage/daily/", "get"), ("/api/me/", "get")):
        assert "403" in paths[path][method]["responses"], (path, method)
    inference_key = client_for("inference_key")
    assert inference_key.get(f"/api/tenants/{cast.tenant.slug}/keys/").status_code == 403  # what it documents
    operator = client_for("operator")
    for slug in ("_x_", "Upper", "a--b"):
        assert operator.post("/api/tenants/", {"name": "X", "slug": slug}, format="json").status_code == 400
    assert operator.post("/api/tenants/", {"name": "X", "slug": "a_b-c9"}, format="json").status_code == 201
    owner = client_for("owner")
    repeated = owner.post(f"/api/tenants/{cast.tenant.slug}/keys/",
                          {"name": "r", "scopes": ["inference", "inference", "manage"]}, format="json")
    assert repeated.status_code == 201 and repeated.json()["scopes"] == ["inference", "manage"]
