"""Schemas in a real browser (Chromium through Playwright) against the whole stack: an admin registers a schema,
watches the stack's Celery worker compile it on the engines (the page polls), adds a version the engines refuse and
reads their reason, and deletes the schema. Every page is checked with axe-core."""

import json

import pytest
from playwright.sync_api import expect

from tenants import services
from tenants.models import Role
from tests.console.browser import assert_accessible, new_page, save_screenshot, sign_in
from tests.schemas.conftest import INVOICE
from tests.tenants.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.stack, pytest.mark.slow]
COMPILED_MS = 90_000  # a compile on every engine, on a busy 2-core machine


@pytest.fixture
def admin(stack, chromium, transactional_db, fresh_quota_counters):
    tenant = services.tenant_create(name="Initech", slug="initech")
    return MembershipFactory(tenant=tenant, role=Role.ADMIN, user=UserFactory(email="bill@initech.test")).user


def test_admin_registers_a_schema_watches_it_compile_adds_a_failing_version_and_deletes(stack, chromium, admin):
    page = new_page(chromium, stack.web_url)
    sign_in(page, stack.web_url, admin.email)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Schemas").click()
    expect(page.get_by_text("No schemas yet.")).to_be_visible()
    page.get_by_label("Name").fill("invoice")
    page.get_by_label("JSON Schema").fill(json.dumps(INVOICE, indent=2))
    page.get_by_label("Description").fill("An invoice's number and currency")
    assert_accessible(page)
    page.get_by_role("button", name="Register schema").click()

    expect(page).to_have_url(f"{stack.web_url}/t/initech/schemas/invoice/")
    expect(page.locator("#messages")).to_contain_text("is registered")
    expect(page.locator("#version-1")).to_have_attribute("data-status", "ready", timeout=COMPILED_MS)
    expect(page.get_by_test_id("serving-version")).to_have_text("version 1")
    expect(page.locator("#version-1")).to_contain_text(f"on {len(stack.engine_urls)} engines")
    page.get_by_text("JSON Schema of v1").click()
    expect(page.get_by_test_id("document-v1")).to_contain_text('"currency"')

    page.get_by_label("JSON Schema").fill('{"type": "array", "uniqueItems": true}')
    page.get_by_role("button", name="Save version").click()
    expect(page.get_by_test_id("failure-v2")).to_contain_text("Version 2 failed to compile:", timeout=COMPILED_MS)
    expect(page.get_by_test_id("failure-v2")).to_contain_text("uniqueItems")
    expect(page.get_by_test_id("serving-version")).to_have_text("version 1")
    assert_accessible(page)
    save_screenshot(page, "schema-detail", full_page=True)

    page.get_by_role("link", name="← Schemas").click()
    expect(page.locator("#schema-invoice")).to_contain_text("version 1")
    assert_accessible(page)
    save_screenshot(page, "schemas")
    page.get_by_role("link", name="invoice").click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete schema “invoice”").click()
    expect(page).to_have_url(f"{stack.web_url}/t/initech/schemas/")
    expect(page.get_by_text("No schemas yet.")).to_be_visible()
    expect(page.locator("#messages")).to_contain_text("is deleted")
