"""The console in a real browser (Chromium through Playwright) against the live ASGI app of the whole stack:
a tenant admin, a teammate, an operator and an outsider, each doing what they came for. Every page visited is
checked with axe-core (WCAG 2.1 A/AA); the main pages are saved as screenshots (tests/console/browser.py)."""

import re
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import expect

from tenants import services
from tenants.models import Role
from tests.console.browser import (
    assert_accessible,
    new_page,
    save_screenshot,
    seed_usage,
    sign_in,
    sticking_out,
)
from tests.tenants.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.stack, pytest.mark.slow]


@dataclass
class World:
    base_url: str
    acme: object
    globex: object
    admin: object
    teammate: object
    outsider: object
    operator: object


@pytest.fixture
def world(stack, chromium, transactional_db) -> World:
    """Two tenants with a few weeks of usage, and one person of each kind (rows committed: the server sees them)."""
    acme = services.tenant_create(name="Acme Robotics", slug="acme")
    globex = services.tenant_create(name="Globex", slug="globex")
    admin = MembershipFactory(tenant=acme, role=Role.ADMIN, user=UserFactory(email="ada@acme.test")).user
    teammate = MembershipFactory(tenant=acme, role=Role.MEMBER, user=UserFactory(email="ben@acme.test")).user
    outsider = MembershipFactory(tenant=globex, role=Role.ADMIN, user=UserFactory(email="olga@globex.test")).user
    operator = UserFactory(email="ops@platform.test", is_staff=True)
    services.quota_set(tenant=acme, changes={"monthly_tokens": 80_000}, changed_by=operator)
    seed_usage(acme, adapters={"support-bot": 6, "sql-writer": 3, "": 2}, seed=1)
    seed_usage(globex, adapters={"summarizer": 4}, num_days=5, seed=2)
    return World(stack.web_url, acme, globex, admin, teammate, outsider, operator)


def api_me(base_url: str, raw_key: str) -> int:
    return httpx.get(f"{base_url}/api/me/", headers={"Authorization": f"Bearer {raw_key}"}, timeout=10).status_code


def test_admin_creates_a_key_sees_its_secret_once_and_revokes_it(chromium, world):
    page = new_page(chromium, world.base_url)
    sign_in(page, world.base_url, world.admin.email)
    expect(page).to_have_url(f"{world.base_url}/t/acme/")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.locator("#month-meter")).to_be_visible()
    assert_accessible(page)
    save_screenshot(page, "overview")
    page.keyboard.press("Tab")  # the first stop is the skip link, which jumps over the navigation
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()

    page.get_by_role("navigation", name="Main").get_by_role("link", name="API keys").click()
    page.get_by_label("Name").fill("production backend")
    page.get_by_label("Manage").check()
    page.get_by_role("button", name="Create key").click()
    secret_field = page.locator("#new-key-secret")
    expect(secret_field).to_be_visible()
    secret = secret_field.input_value()
    assert re.fullmatch(r"[A-Za-z0-9]{8}\.[A-Za-z0-9]{32}", secret)
    expect(page.locator("#new-key-snippet")).to_contain_text(f'OpenAI(base_url="{world.base_url}/v1"')
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    assert api_me(world.base_url, secret) == 200  # the secret shown is a working key
    assert_accessible(page)
    save_screenshot(page, "api-key-created")

    page.reload()
    assert secret not in page.content()  # shown once
    row = page.locator("tr", has_text="production backend")
    expect(row).to_contain_text("active")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("tr", has_text="production backend")).to_contain_text("revoked")
    expect(page.locator("#messages")).to_contain_text("is revoked")
    assert api_me(world.base_url, secret) == 401
    page.context.close()


def test_admin_reads_the_usage_dashboard_and_invites_a_teammate(chromium, world):
    page = new_page(chromium, world.base_url)
    sign_in(page, world.base_url, world.admin.email)
    page.goto("/t/acme/usage/")
    labels = page.evaluate("Chart.getChart(document.getElementById('tokens-chart')).data.datasets.map(d => d.label)")
    assert sorted(labels) == ["base model", "sql-writer", "support-bot"]
    num_days = page.evaluate("Chart.getChart(document.getElementById('requests-chart')).data.labels.length")
    assert num_days == 30
    assert_accessible(page)
    save_screenshot(page, "usage-dashboard")

    page.get_by_role("link", name="7 days").click()  # htmx swaps the dashboard and pushes the URL
    expect(page).to_have_url(re.compile(r"/t/acme/usage/\?since=.*&until="))
    page.wait_for_function("""() => {
        const chart = Chart.getChart(document.getElementById("requests-chart"));  // drawn again after the swap
        return chart !== undefined && chart.data.labels.length === 7;
    }""")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    header = open(download.value.path()).readline().strip()
    assert header.startswith("day,adapter,requests,errors")

    page.goto("/t/acme/members/")
    page.get_by_label("Email").fill("carol@acme.test")
    page.get_by_role("button", name="Create invitation").click()
    expect(page.locator("#invitation-link")).to_have_value(re.compile(f"^{world.base_url}/invite/"))
    expect(page.get_by_role("row", name=re.compile("carol@acme.test"))).to_be_visible()
    assert_accessible(page)
    save_screenshot(page, "members")
    page.context.close()


def test_teammate_sees_read_only_pages(chromium, world):
    key, _ = services.api_key_create(tenant=world.acme, name="ci pipeline", scopes=["inference"])
    page = new_page(chromium, world.base_url)
    sign_in(page, world.base_url, world.teammate.email)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    page.goto("/t/acme/keys/")
    expect(page.get_by_role("row", name=re.compile("ci pipeline"))).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("Revoke|Create key"))).to_have_count(0)
    page.goto("/t/acme/members/")
    expect(page.get_by_role("combobox")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("Remove|Create invitation"))).to_have_count(0)
    assert_accessible(page)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing may stick out sideways
    for path in ("/t/acme/", "/t/acme/keys/", "/t/acme/usage/", "/t/acme/adapters/", "/t/acme/playground/"):
        page.goto(path)
        assert sticking_out(page) == [], path
    save_screenshot(page, "usage-phone")
    status = page.evaluate(
        """async (url) => (await fetch(url, {method: "POST", headers: {"X-CSRFToken":
            document.cookie.match(/csrftoken=([^;]+)/)[1]}})).status""",
        f"/t/acme/keys/{key.prefix}/revoke/",
    )
    assert status == 403
    page.goto("/t/acme/keys/")
    expect(page.get_by_role("row", name=re.compile("ci pipeline"))).to_contain_text("active")
    page.context.close()


def test_operator_changes_a_quota_and_finds_it_in_the_history(chromium, world):
    page = new_page(chromium, world.base_url)
    sign_in(page, world.base_url, world.operator.email)
    expect(page).to_have_url(f"{world.base_url}/operator/tenants/")
    page.get_by_label("Search").fill("acm")  # htmx searches as one types
    expect(page.get_by_role("row", name=re.compile("Globex"))).to_have_count(0)
    expect(page.get_by_role("row", name=re.compile("Acme Robotics"))).to_be_visible()
    assert_accessible(page)
    save_screenshot(page, "operator-tenants")

    page.get_by_role("link", name="Quota of Acme Robotics").click()
    page.get_by_label("Tokens per month").fill("5000")
    page.get_by_label("Requests per minute").fill("30")
    page.get_by_role("button", name="Save quota").click()
    expect(page.locator("#messages")).to_contain_text("Quota of Acme Robotics saved")
    newest = page.locator("#quota-history").get_by_role("row", name=re.compile("Tokens per month")).first
    expect(newest).to_contain_text(re.compile(r"80,000\s+5,000\s+ops@platform\.test"))
    expect(page.get_by_test_id("effective-monthly_tokens")).to_have_text("5,000")
    assert_accessible(page)
    save_screenshot(page, "operator-quota", full_page=True)

    page.goto("/t/acme/")
    expect(page.locator("#month-meter")).to_have_attribute("max", "5000")
    page.goto("/operator/usage/")
    expect(page.get_by_role("row", name=re.compile("^Acme Robotics"))).to_be_visible()
    assert page.evaluate("Chart.getChart(document.getElementById('tenants-chart')).data.labels") == [
        "Acme Robotics", "Globex"]
    assert_accessible(page)
    save_screenshot(page, "operator-usage")

    page.goto("/operator/tenants/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Suspend Globex").click()
    expect(page.get_by_role("row", name=re.compile("Globex"))).to_contain_text("suspended")
    page.context.close()


def test_outsider_sees_nothing_of_the_tenant(chromium, world):
    page = new_page(chromium, world.base_url)
    page.goto("/login/")
    assert_accessible(page)
    sign_in(page, world.base_url, world.outsider.email)
    expect(page).to_have_url(f"{world.base_url}/t/globex/")
    for path in ("/password/", "/t/globex/adapters/"):  # the pages no other test visits
        page.goto(path)
        assert_accessible(page)
    expect(page.locator("body")).not_to_contain_text("Acme")
    for path in ("/t/acme/", "/t/acme/usage/", "/t/acme/keys/", "/t/acme/members/", "/t/acme/adapters/",
                 "/t/acme/playground/", "/operator/tenants/", "/operator/engines/"):
        response = page.goto(path)
        assert response.status == 404, path
        assert "Acme" not in page.content()
    page.goto("/t/globex/")
    status = page.evaluate(
        """async () => (await fetch("/t/acme/members/invite/", {method: "POST", headers: {"X-CSRFToken":
            document.cookie.match(/csrftoken=([^;]+)/)[1]}, body: new URLSearchParams({email: "x@globex.test",
            role: "admin"})})).status"""
    )
    assert status == 404
    page.context.close()
