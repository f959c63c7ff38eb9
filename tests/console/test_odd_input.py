"""Odd input a person or a page can send the console gets a clean answer, never a 500 (found by a security probe):
dates at the ends of the calendar, NUL bytes in URL paths, quota numbers past their column, and the API's login
taking JSON only (a cross-site form could otherwise sign a victim into the sender's account: login CSRF)."""

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import Quota
from tests.tenants.factories import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("since, until", [("9999-12-30", "9999-12-31"), ("0001-01-01", "0001-01-03")])
def test_usage_pages_take_any_date_range(cast, client_as, since, until):
    slug = cast.tenant.slug
    for who, url in [("owner", reverse("console:tenant-usage", args=[slug])),
                     ("owner", reverse("console:tenant-usage-export", args=[slug])),
                     ("operator", reverse("console:operator-usage"))]:
        response = client_as(who).get(url, {"since": since, "until": until})
        assert response.status_code in (200, 400), (url, response.status_code)


def test_a_nul_byte_in_a_url_path_is_a_404(cast, client_as):
    owner, slug = client_as("owner"), cast.tenant.slug
    assert owner.get(f"/t/{slug}/adapters/%00/").status_code == 404
    assert owner.post(f"/t/{slug}/adapters/%00/delete/").status_code == 404
    assert owner.post(f"/t/{slug}/keys/%00/revoke/").status_code == 404


def test_quota_numbers_past_their_column_are_refused_by_the_form(cast, client_as):
    response = client_as("operator").post(reverse("console:operator-quota", args=[cast.tenant.slug]),
                                          {"max_adapters": str(2**63 - 1), "monthly_tokens": str(2**40)})
    assert response.status_code == 200 and "less than or equal to 2147483647" in response.content.decode()
    assert not Quota.objects.filter(tenant=cast.tenant, max_adapters__isnull=False).exists()


def test_the_api_login_takes_json_only(cast):
    form = APIClient(enforce_csrf_checks=True).post("/api/auth/login/",
                                                    {"email": cast.owner.email, "password": PASSWORD})
    assert form.status_code == 415 and "sessionid" not in form.cookies
    as_json = APIClient(enforce_csrf_checks=True).post("/api/auth/login/",
                                                       {"email": cast.owner.email, "password": PASSWORD}, format="json")
    assert as_json.status_code == 200 and "sessionid" in as_json.cookies
