"""Playwright driving Debian's Chromium (devstack/browser.sh installs it) against the whole stack's live app:
launching, signing in, the axe-core accessibility check and screenshots."""

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.sync_api import Browser, Page

from devstack.services import ROOT, state_dir
from tenants import services, usage_days
from tests.tenants.factories import PASSWORD, record

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # installed from npm by `make static`
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
VIEWPORT = {"width": 1280, "height": 860}


@contextmanager
def launched_chromium() -> Iterator[Browser]:
    """Debian's Chromium through Playwright, headless, for the duration of the block."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls of these tests are still plain
    # synchronous calls, one at a time, so Django's guard against ORM use inside a running loop is lifted here.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def screenshot_dir() -> Path:
    """Where screenshots go: UI_SCREENSHOT_DIR (docs/screenshots/ to refresh the README's), else the state dir,
    so a plain test run never rewrites files tracked by git."""
    folder = Path(os.environ.get("UI_SCREENSHOT_DIR") or state_dir() / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_screenshot(page: Page, name: str, *, full_page: bool = False) -> Path:
    path = screenshot_dir() / f"{name}.png"
    page.screenshot(path=path, animations="disabled", caret="hide", full_page=full_page)
    return path


def new_page(browser: Browser, base_url: str) -> Page:
    context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
    return context.new_page()


def sign_in(page: Page, base_url: str, email: str, password: str = PASSWORD) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def axe_violations(page: Page) -> list[dict]:
    """WCAG 2.1 A/AA violations axe-core finds on the page as it is now: [{id, impact, help, targets}]."""
    page.add_script_tag(path=str(AXE))
    return page.evaluate(
        """async (tags) => {
            const result = await axe.run(document, {runOnly: {type: "tag", values: tags}});
            return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                                targets: v.nodes.map(n => n.target.join(" "))}));
        }""",
        AXE_TAGS,
    )


def assert_accessible(page: Page) -> None:
    violations = axe_violations(page)
    assert violations == [], f"accessibility violations on {page.url}: {violations}"


def sticking_out(page: Page) -> list[str]:
    """Elements reaching past the right edge of the viewport (the page scrolls sideways), as short descriptions."""
    return page.evaluate(
        """() => document.documentElement.scrollWidth <= window.innerWidth ? [] :
            [...document.querySelectorAll("body *")]
              .filter(e => e.checkVisibility() && e.getBoundingClientRect().right > window.innerWidth + 1)
              .slice(0, 8).map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") +
                                    (e.className ? "." + String(e.className).split(" ").join(".") : ""))"""
    )


def seed_usage(tenant, *, adapters: dict[str, int], num_days: int = 14, seed: int = 0) -> None:
    """Usage rows of the last `num_days` UTC days, written by the same service the gateway uses, with the days
    the beat would have rolled up rolled up. `adapters` maps a name ("" = base model) to requests per day."""
    rng = random.Random(seed)
    today = datetime.now(UTC).date()
    n = 0
    for back in range(num_days - 1, -1, -1):
        day = today - timedelta(days=back)
        for adapter, per_day in adapters.items():
            for _ in range(max(1, int(per_day * rng.uniform(0.5, 1.3)))):
                n += 1
                record(tenant, n, day=day, adapter=adapter, prompt=rng.randrange(20, 400),
                       completion=rng.randrange(10, 300), latency_ms=int(rng.lognormvariate(5.5, 0.6)),
                       hour=rng.randrange(24))
        if day < usage_days.first_live_day(today):
            services.usage_rollup_day(day=day)
