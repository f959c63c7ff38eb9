"""A tenant's fairness weight and priority class (quota fields: operators set them, audited; tenant admins see them)
and the priority of an API key, through the services, the management API and the commands."""

import io

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from engine.fair_share import PRIORITIES
from tenants import selectors, services
from tenants.models import QuotaChange, TenantAPIKey
from tenants.priority import BATCH, INTERACTIVE, PRIORITY_CODES, effective_priority
from tests.tenants.factories import TenantFactory

pytestmark = pytest.mark.django_db


def audit(tenant) -> list[tuple]:
    """(field, old, new) of the tenant's audit rows, oldest first."""
    return list(QuotaChange.objects.filter(tenant=tenant).order_by("id").values_list("field", "old_value",
                                                                                      "new_value"))


def test_the_codes_name_every_class_the_engine_knows():
    assert set(PRIORITY_CODES) == set(PRIORITIES)
    assert effective_priority(INTERACTIVE, INTERACTIVE) == INTERACTIVE
    assert effective_priority(BATCH, INTERACTIVE) == effective_priority(INTERACTIVE, BATCH) == BATCH


def test_defaults_are_weight_one_and_interactive(settings):
    quota = selectors.quota_effective(tenant=TenantFactory())
    assert settings.TENANT_QUOTA_DEFAULTS["fairness_weight"] == 1
    assert (quota.fairness_weight, quota.priority) == (1, INTERACTIVE)


def test_quota_set_audits_weight_and_class_as_integers():
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes={"fairness_weight": 4, "priority_class": PRIORITY_CODES[BATCH]},
                       source="test")
    quota = selectors.quota_effective(tenant=tenant)
    assert (quota.fairness_weight, quota.priority) == (4, BATCH)
    assert audit(tenant) == [("fairness_weight", None, 4), ("priority_class", None, 2)]
    services.quota_set(tenant=tenant, changes={"priority_class": None})
    assert selectors.quota_effective(tenant=tenant).priority == INTERACTIVE
    assert audit(tenant)[-1] == ("priority_class", 2, None)


@pytest.mark.parametrize("changes", [{"fairness_weight": 1001}, {"priority_class": 3}, {"priority_class": 0}])
def test_quota_set_refuses_a_weight_over_1000_or_an_unknown_class(changes):
    tenant = TenantFactory()
    with pytest.raises(ValidationError):
        services.quota_set(tenant=tenant, changes=changes)
    assert audit(tenant) == []


def test_operator_sets_them_by_name_and_the_audit_shows_names(client_for, cast):
    url = f"/api/tenants/{cast.tenant.slug}/quota/"
    response = client_for("operator").patch(url, {"fairness_weight": 7, "priority_class": "batch"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["effective"]["fairness_weight"], body["effective"]["priority_class"]) == (7, "batch")
    assert (body["overrides"]["fairness_weight"], body["overrides"]["priority_class"]) == (7, "batch")
    assert audit(cast.tenant) == [("fairness_weight", None, 7), ("priority_class", None, 2)]
    changes = client_for("owner").get(url + "changes/").json()["results"]
    assert sorted((c["field"], c["old_value"], c["new_value"]) for c in changes) == [
        ("fairness_weight", None, 7), ("priority_class", None, "batch")]


def test_tenant_admins_see_them_but_only_operators_change_them(client_for, cast):
    url = f"/api/tenants/{cast.tenant.slug}/quota/"
    for who in ("owner", "manage_key"):
        refused = client_for(who).patch(url, {"priority_class": "interactive", "fairness_weight": 1000},
                                        format="json")
        assert refused.status_code == 403, who
    assert client_for("outsider").patch(url, {"fairness_weight": 2}, format="json").status_code == 404
    assert client_for("outsider").get(url).status_code == 404
    assert audit(cast.tenant) == []
    seen = client_for("teammate").get(url).json()
    assert (seen["effective"]["fairness_weight"], seen["effective"]["priority_class"]) == (1, "interactive")
    assert (seen["overrides"]["fairness_weight"], seen["overrides"]["priority_class"]) == (None, None)


@pytest.mark.parametrize("body, field", [({"fairness_weight": 1001}, "fairness_weight"),
                                         ({"fairness_weight": 0}, "fairness_weight"),
                                         ({"priority_class": "urgent"}, "priority_class"),
                                         ({"priority_class": 2}, "priority_class")])
def test_bad_values_are_400s_naming_the_field(client_for, cast, body, field):
    response = client_for("operator").patch(f"/api/tenants/{cast.tenant.slug}/quota/", body, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["attr"] == field
    assert audit(cast.tenant) == []


def test_an_admin_creates_a_batch_key_and_the_list_shows_each_keys_priority(client_for, cast):
    url = f"/api/tenants/{cast.tenant.slug}/keys/"
    owner = client_for("owner")
    created = owner.post(url, {"name": "nightly", "scopes": ["inference"], "priority": "batch"}, format="json")
    plain = owner.post(url, {"name": "chat", "scopes": ["inference"]}, format="json")
    assert (created.status_code, plain.status_code) == (201, 201)
    assert (created.json()["priority"], plain.json()["priority"]) == ("batch", "interactive")
    listed = {k["name"]: k["priority"] for k in client_for("teammate").get(url).json()["results"]}
    assert listed == {"nightly": "batch", "chat": "interactive"}
    bad = owner.post(url, {"name": "x", "scopes": ["inference"], "priority": "urgent"}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["attr"] == "priority"
    teammate = client_for("teammate").post(url, {"name": "y", "scopes": ["inference"], "priority": "batch"},
                                           format="json")
    assert teammate.status_code == 403
    assert set(TenantAPIKey.objects.filter(tenant=cast.tenant).values_list("name", flat=True)) == {"nightly", "chat"}


def test_the_service_refuses_an_unknown_key_priority():
    with pytest.raises(ValidationError, match="priority"):
        services.api_key_create(tenant=TenantFactory(), name="x", scopes=["inference"], priority="urgent")


def test_the_gateways_key_lookup_carries_the_keys_priority_and_the_tenants_plan():
    tenant = TenantFactory()
    services.quota_set(tenant=tenant, changes={"fairness_weight": 9})
    _, raw = services.api_key_create(tenant=tenant, name="nightly", scopes=["inference"], priority=BATCH)
    info = async_to_sync(selectors.api_key_lookup_async)(raw)
    assert (info.priority, info.tenant.quota.fairness_weight, info.tenant.quota.priority) == (BATCH, 9, INTERACTIVE)


def run(*args) -> list[str]:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()


def test_set_quota_takes_the_weight_and_the_class_by_name():
    tenant = TenantFactory()
    lines = run("set_quota", tenant.slug, "--fairness-weight", "3", "--priority-class", "batch")
    assert "fairness_weight              3" in lines and "priority_class               batch" in lines
    assert audit(tenant) == [("fairness_weight", None, 3), ("priority_class", None, 2)]
    run("set_quota", tenant.slug, "--priority-class", "default")
    assert selectors.quota_effective(tenant=tenant).priority == INTERACTIVE
    with pytest.raises(CommandError, match="invalid choice"):
        run("set_quota", tenant.slug, "--priority-class", "urgent")
    with pytest.raises(CommandError, match="1000"):
        run("set_quota", tenant.slug, "--fairness-weight", "1001")


def test_create_api_key_takes_a_priority():
    tenant = TenantFactory()
    run("create_api_key", tenant.slug, "--name", "jobs", "--priority", "batch")
    assert TenantAPIKey.objects.get(tenant=tenant, name="jobs").priority == BATCH
