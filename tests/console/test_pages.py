"""Sign-in, the home page's choice of tenant, the overview against quota, the usage dashboard and its CSV."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from tenants import services
from tenants.models import UsageStatus
from tests.tenants.factories import PASSWORD, MembershipFactory, UserFactory, record

pytestmark = pytest.mark.django_db
TODAY = datetime.now(UTC).date()


def test_sign_in_and_out(cast, client):
    page = client.get(reverse("console:login"))
    assert page.status_code == 200 and 'autocomplete="current-password"' in page.content.decode()
    wrong = client.post(reverse("console:login"), {"username": cast.owner.email, "password": "nope"})
    assert wrong.status_code == 200 and "role=\"alert\"" in wrong.content.decode()
    response = client.post(reverse("console:login"), {"username": cast.owner.email, "password": PASSWORD},
                           follow=True)
    assert response.redirect_chain[-1][0] == f"/t/{cast.tenant.slug}/"
    assert client.post(reverse("console:logout")).status_code == 302
    assert client.get(f"/t/{cast.tenant.slug}/").status_code == 302


def test_password_change(cast, client_as):
    owner = client_as("owner")
    response = owner.post(reverse("console:password-change"), {
        "old_password": PASSWORD, "new_password1": "another-long-secret-9", "new_password2": "another-long-secret-9"})
    assert response.status_code == 302 and response["Location"] == reverse("console:password-change-done")
    cast.owner.refresh_from_db()
    assert cast.owner.check_password("another-long-secret-9")
    assert owner.get(reverse("console:tenant-overview", args=[cast.tenant.slug])).status_code == 200  # still in


def test_home_redirects_or_offers_a_choice(cast, client_as):
    assert client_as("owner").get("/")["Location"] == f"/t/{cast.tenant.slug}/"
    assert client_as("operator").get("/")["Location"] == reverse("console:operator-tenants")
    MembershipFactory(tenant=cast.other_tenant, user=cast.owner)
    page = client_as("owner").get("/")
    assert page.status_code == 200
    assert [t.name for t in page.context["tenants"]] == sorted([cast.tenant.name, cast.other_tenant.name])
    client = Client()
    client.force_login(UserFactory())
    assert "do not belong to any tenant" in client.get("/").content.decode()


def test_the_switcher_lists_only_the_persons_tenants(cast, client_as):
    html = client_as("outsider").get(reverse("console:tenant-overview", args=[cast.other_tenant.slug])).content
    assert cast.other_tenant.name.encode() in html and cast.tenant.name.encode() not in html


def test_overview_against_quota(cast, client_as):
    services.quota_set(tenant=cast.tenant, changes={"monthly_tokens": 1000})
    record(cast.tenant, 1, prompt=100, completion=50)
    record(cast.tenant, 2, prompt=40, completion=10)
    record(cast.other_tenant, 3, prompt=999)
    if TODAY.day > 1:
        record(cast.tenant, 4, day=TODAY - timedelta(days=1), prompt=300, completion=0)
    response = client_as("teammate").get(reverse("console:tenant-overview", args=[cast.tenant.slug]))
    month_tokens = 200 + (300 if TODAY.day > 1 else 0)
    assert (response.context["day"]["tokens"], response.context["day"]["num_requests"]) == (200, 2)
    assert response.context["month"]["tokens"] == month_tokens
    assert response.context["month_share"] == month_tokens / 10
    days_in_month = response.context["days_in_month"]
    assert response.context["daily_share"] == round(1000 / days_in_month)
    assert response.context["day_share"] == round(100 * 200 / (1000 / days_in_month), 1)
    html = response.content.decode()
    assert 'max="1000"' in html and f'value="{month_tokens}"' in html and "<meter" in html


def test_usage_dashboard_series_and_totals(cast, client_as):
    record(cast.tenant, 1, adapter="sql", prompt=10, completion=5, latency_ms=40)
    record(cast.tenant, 2, adapter="", prompt=1, completion=1, status=UsageStatus.ERROR, latency_ms=400)
    record(cast.tenant, 3, day=TODAY - timedelta(days=2), adapter="sql", prompt=7, completion=0)
    services.usage_rollup_day(day=TODAY - timedelta(days=2))
    response = client_as("owner").get(reverse("console:tenant-usage", args=[cast.tenant.slug]),
                                      {"since": (TODAY - timedelta(days=2)).isoformat(), "until": TODAY.isoformat()})
    chart = response.context["chart"]
    assert chart["days"] == [(TODAY - timedelta(days=n)).isoformat() for n in (2, 1, 0)]
    assert chart["series"] == ["sql", "base model"]
    assert chart["tokens"] == {"sql": [7, 0, 15], "base model": [0, 0, 2]}
    assert chart["requests"] == {"sql": [1, 0, 1], "base model": [0, 0, 1]}
    assert chart["p50"][1] is None and chart["p95"][2] is not None
    totals = response.context["totals"]
    assert (totals["num_requests"], totals["num_errors"], totals["tokens"]) == (3, 1, 24)
    html = response.content.decode()
    assert 'id="usage-data"' in html and 'data-chart="stacked"' in html and "Download CSV" in html


def test_usage_dashboard_bad_range_falls_back_to_the_last_30_days(cast, client_as):
    response = client_as("owner").get(reverse("console:tenant-usage", args=[cast.tenant.slug]),
                                      {"since": TODAY.isoformat(), "until": (TODAY - timedelta(days=3)).isoformat()})
    assert response.status_code == 200 and len(response.context["chart"]["days"]) == 30
    assert "must not be after" in response.content.decode()
    too_long = client_as("owner").get(reverse("console:tenant-usage", args=[cast.tenant.slug]),
                                      {"since": "2000-01-01"})
    assert "at most 366 days" in too_long.content.decode()


def test_usage_csv_has_the_dashboards_rows(cast, client_as):
    record(cast.tenant, 1, adapter="sql", prompt=10, completion=5, latency_ms=40)
    record(cast.tenant, 2, adapter="=cmd", prompt=1, completion=1)
    record(cast.other_tenant, 3, adapter="theirs")
    response = client_as("teammate").get(reverse("console:tenant-usage-export", args=[cast.tenant.slug]),
                                         {"since": TODAY.isoformat(), "until": TODAY.isoformat()})
    assert response["Content-Type"].startswith("text/csv")
    assert f'filename="usage-{cast.tenant.slug}-{TODAY}-{TODAY}.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["adapter"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("'=cmd", "1", "1", "1"), ("sql", "1", "10", "5")]
    assert float(rows[1]["latency_ms_p50"]) == pytest.approx(37.5)  # middle of the 25-50 ms bucket's one request
