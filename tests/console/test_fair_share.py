"""The console's side of fair service: operators set a tenant's weight and priority class in the quota editor;
admins create batch keys; everyone in the tenant sees the class of each key and the plan's class and weight."""

import pytest
from django.urls import reverse

from tenants import selectors, services
from tenants.models import QuotaChange, TenantAPIKey
from tenants.priority import BATCH, INTERACTIVE, PRIORITY_CODES

pytestmark = pytest.mark.django_db


def test_operator_sets_weight_and_class_and_the_history_names_the_class(cast, client_as):
    operator = client_as("operator")
    url = reverse("console:operator-quota", args=[cast.tenant.slug])
    page = operator.get(url).content.decode()
    assert 'name="priority_class"' in page and '<option value="batch">Batch</option>' in page
    response = operator.post(url, {"fairness_weight": "5", "priority_class": "batch"}, follow=True)
    quota = selectors.quota_effective(tenant=cast.tenant)
    assert (quota.fairness_weight, quota.priority) == (5, BATCH)
    assert sorted(QuotaChange.objects.filter(tenant=cast.tenant).values_list("field", "new_value")) == [
        ("fairness_weight", 5), ("priority_class", PRIORITY_CODES[BATCH])]
    html = response.content.decode()
    assert 'data-testid="effective-priority_class">batch<' in html
    assert '<option value="batch" selected>' in html  # the saved override is what the form shows
    history = {change.label: change.new_value for change in response.context["history"]}
    assert history == {"Fairness weight": 5, "Priority class": "batch"}
    operator.post(url, {"fairness_weight": "5", "priority_class": ""})  # empty: back to the platform default
    assert selectors.quota_effective(tenant=cast.tenant).priority == INTERACTIVE


def test_the_editor_refuses_a_weight_over_1000_and_an_unknown_class(cast, client_as):
    url = reverse("console:operator-quota", args=[cast.tenant.slug])
    response = client_as("operator").post(url, {"fairness_weight": "1001", "priority_class": "urgent"})
    assert set(response.context["form"].errors) == {"fairness_weight", "priority_class"}
    assert not QuotaChange.objects.exists()


@pytest.mark.parametrize("who", ["owner", "teammate", "outsider"])
def test_only_operators_may_post_the_editor(cast, client_as, who):
    url = reverse("console:operator-quota", args=[cast.tenant.slug])
    assert client_as(who).post(url, {"priority_class": "batch"}).status_code == 404
    assert not QuotaChange.objects.exists()


def test_an_admin_creates_a_batch_key_and_the_list_shows_priorities(cast, client_as):
    owner = client_as("owner")
    url = reverse("console:tenant-keys", args=[cast.tenant.slug])
    assert 'name="priority"' in owner.get(url).content.decode()
    owner.post(url, {"name": "nightly", "scopes": ["inference"], "priority": "batch"})
    owner.post(url, {"name": "chat", "scopes": ["inference"]})
    keys = {key.name: key for key in TenantAPIKey.objects.filter(tenant=cast.tenant)}
    assert (keys["nightly"].priority, keys["chat"].priority) == (BATCH, INTERACTIVE)
    listing = client_as("teammate").get(url).content.decode()
    assert f'data-testid="priority-{keys["nightly"].prefix}">batch<' in listing
    assert f'data-testid="priority-{keys["chat"].prefix}">interactive<' in listing
    refused = owner.post(url, {"name": "odd", "scopes": ["inference"], "priority": "urgent"})
    assert "priority" in refused.context["form"].errors and not TenantAPIKey.objects.filter(name="odd").exists()


def test_the_keys_page_tells_the_tenant_its_plans_class_and_weight(cast, client_as):
    services.quota_set(tenant=cast.tenant, changes={"fairness_weight": 3, "priority_class": PRIORITY_CODES[BATCH]})
    page = client_as("teammate").get(reverse("console:tenant-keys", args=[cast.tenant.slug])).content.decode()
    assert "fairness weight 3 in the batch class, so every key is batch" in page
    other = client_as("outsider").get(reverse("console:tenant-keys", args=[cast.other_tenant.slug])).content.decode()
    assert "fairness weight 1 in the interactive class" in other
