"""Operator pages: tenant search, creation, suspension; the quota editor and its audit trail; platform usage."""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.urls import reverse

from tenants import selectors, services
from tenants.models import QuotaChange, Tenant
from tests.tenants.factories import TenantFactory, record

pytestmark = pytest.mark.django_db
TODAY = datetime.now(UTC).date()


def test_search_and_status_filter(cast, client_as):
    services.tenant_create(name="Zebra Labs", slug="zebra")
    services.tenant_set_status(tenant=cast.other_tenant, status=Tenant.Status.SUSPENDED)
    operator = client_as("operator")
    url = reverse("console:operator-tenants")
    found = operator.get(url, {"q": "zeb"}).context["page"].object_list
    assert [t.slug for t in found] == ["zebra"]
    suspended = operator.get(url, {"status": "suspended"}).context["page"].object_list
    assert [t.slug for t in suspended] == [cast.other_tenant.slug]
    assert operator.get(url, {"status": "bogus"}).context["page"].paginator.count == 3  # a bad filter is ignored


def test_create_leads_to_the_new_tenants_members(client_as):
    response = client_as("operator").post(reverse("console:operator-tenants"), {"name": "Initech", "slug": ""})
    assert response.status_code == 303 and response["Location"] == "/t/initech/members/"
    response = client_as("operator").post(reverse("console:operator-tenants"), {"name": "X", "slug": "initech"})
    assert response.status_code == 200 and "exists" in " ".join(response.context["create_form"].errors["slug"])


def test_suspend_and_reactivate(cast, client_as):
    url = reverse("console:operator-tenant-status", args=[cast.tenant.slug])
    operator = client_as("operator")
    assert "suspended" in operator.post(url, {"status": "suspended"}, follow=True).content.decode()
    assert Tenant.objects.get(pk=cast.tenant.pk).status == Tenant.Status.SUSPENDED
    operator.post(url, {"status": "active"})
    assert Tenant.objects.get(pk=cast.tenant.pk).status == Tenant.Status.ACTIVE
    assert "Unknown status" in operator.post(url, {"status": "gone"}, follow=True).content.decode()
    kept = operator.post(url, {"status": "active", "q": "ten", "filter_status": "active"})
    assert kept["Location"] == reverse("console:operator-tenants") + "?q=ten&status=active"  # the same search


def test_quota_editor_saves_overrides_and_shows_the_audit_trail(cast, client_as):
    operator = client_as("operator")
    url = reverse("console:operator-quota", args=[cast.tenant.slug])
    response = operator.post(url, {"monthly_tokens": "5000", "requests_per_minute": "7"}, follow=True)
    assert selectors.quota_overrides(tenant=cast.tenant)["monthly_tokens"] == 5000
    assert selectors.quota_effective(tenant=cast.tenant).requests_per_minute == 7
    changes = QuotaChange.objects.filter(tenant=cast.tenant)
    assert sorted(changes.values_list("field", "old_value", "new_value")) == [
        ("monthly_tokens", None, 5000), ("requests_per_minute", None, 7)]
    assert {change.changed_by for change in changes} == {cast.operator} and {c.source for c in changes} == {"console"}
    html = response.content.decode()
    assert "Tokens per month" in html and "5,000" in html and cast.operator.email in html
    # Emptying a field goes back to the default, audited too; the rest of the form stays as it was.
    operator.post(url, {"monthly_tokens": "", "requests_per_minute": "7"})
    assert selectors.quota_overrides(tenant=cast.tenant)["monthly_tokens"] is None
    assert QuotaChange.objects.filter(tenant=cast.tenant).count() == 3
    # The owner sees the new limit on the overview.
    overview = client_as("owner").get(reverse("console:tenant-overview", args=[cast.tenant.slug]))
    assert overview.context["quota"].requests_per_minute == 7


def test_quota_editor_refuses_inconsistent_values(cast, client_as):
    url = reverse("console:operator-quota", args=[cast.tenant.slug])
    limit = settings.TENANT_QUOTA_DEFAULTS["max_tokens_limit"]
    response = client_as("operator").post(url, {"default_max_tokens": str(limit + 1)})
    assert response.status_code == 200 and "exceeds" in " ".join(response.context["form"].non_field_errors())
    response = client_as("operator").post(url, {"monthly_tokens": "0"})
    assert "monthly_tokens" in response.context["form"].errors
    assert not QuotaChange.objects.exists()


def test_platform_usage_ranks_tenants_and_adapters(client_as):
    big, small = TenantFactory(name="Big"), TenantFactory(name="Small")
    record(big, 1, adapter="sql", prompt=500)
    record(small, 2, adapter="chat", prompt=50)
    record(small, 3, day=TODAY - timedelta(days=40), prompt=10_000)  # outside the default range (this month)
    response = client_as("operator").get(reverse("console:operator-usage"))
    assert [(row["tenant"].name, row["tokens"]) for row in response.context["top_tenants"]] == [
        ("Big", 505), ("Small", 55)]
    assert [(row["adapter"], row["tokens"]) for row in response.context["top_adapters"]] == [("sql", 505),
                                                                                              ("chat", 55)]
    assert response.context["chart"] == {"labels": ["Big", "Small"], "tokens": [505, 55]}
    assert 'id="platform-data"' in response.content.decode()
