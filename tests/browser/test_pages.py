"""Every page in Chromium on the demo data: it renders without script or CSP errors (the page
fixture fails on any console error), it is keyboard-reachable, it fits a 375 px screen, and a
screenshot of it goes to docs/screenshots/ (linked from the README)."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import login, open_first, screenshot, watch

pytestmark = pytest.mark.browser

PAGES = [
    ("overview", "/", "Overview"),
    ("workflows", "/workflows", "Workflows"),
    ("signals", "/signals", "Signal inbox"),
    ("definitions", "/definitions", "Definitions"),
    ("definition", "/definitions/OnboardingWorkflow", "OnboardingWorkflow"),
    ("stranded", "/stranded", "Stranded workflows"),
    ("failures", "/failures?window=7d", "Failure triage"),
    ("audit", "/audit", "Audit log"),
]


def test_every_page_renders_and_is_screenshotted(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    page.goto(f"{base}/login")
    screenshot(page, "login")
    login(page, base, "olga")
    for name, path, heading in PAGES:
        page.goto(base + path)
        expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
        screenshot(page, name)

    # A workflow detail page with a resumable chain, and the hero page behind its hero link.
    page.goto(f"{base}/workflows?class=CampaignWorkflow&step=deliver")
    open_first(page)
    expect(page.locator("#wf-title")).to_contain_text("CampaignWorkflow")
    screenshot(page, "workflow-detail-chain")
    page.locator("dl.facts a").first.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("DemoCampaign")
    screenshot(page, "hero")

    # The stranded drain: a bulk resume_at previews the count before anything changes.
    page.goto(f"{base}/stranded")
    group = page.locator("section.card").first
    expect(group).to_contain_text("send_sms")
    group.get_by_role("button", name="Resume selected at").click()
    expect(page.locator("#bulk-count")).to_contain_text(re.compile(r"\d+ workflows? will be"))
    screenshot(page, "stranded-bulk-preview", full_page=False)


def test_bulk_pause_from_the_list_with_a_confirmation(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=ready")
    boxes = page.locator("input[name=ids]")
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.get_by_role("button", name="Pause selected").click()
    # The preview is the confirmation: a dialog with the count and one button naming it.
    expect(page.locator("#bulk-count")).to_have_text("2 workflows will be paused.")
    screenshot(page, "bulk-preview", full_page=False)
    page.locator("#bulk-dialog").get_by_role("button", name="Pause 2 workflows").click()
    expect(page.locator("#bulk-done")).to_contain_text("Pause selected: 2 done.")
    page.goto(f"{base}/audit")
    expect(page.locator("#audit tbody")).to_contain_text("Pause selected")


def test_keyboard_and_phone_sized_screen(live_server, browser):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 375, "height": 800})
    page = context.new_page()
    errors = watch(page)
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?state=paused")
    # No horizontal scrolling of the page itself at 375 px (tables scroll in their wrapper).
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 375 + 1, width
    screenshot(page, "mobile-workflows", full_page=False)

    # Keyboard: Tab reaches the skip link first, then the navigation, with a visible focus ring.
    page.keyboard.press("Tab")
    expect(page.locator("a.skip")).to_be_focused()
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"
    page.locator("#results tbody a").first.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#wf-title")).to_be_visible()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 375 + 1, width
    screenshot(page, "mobile-workflow-detail", full_page=False)
    context.close()
    assert not errors, f"browser console errors or 5xx answers: {errors}"
