"""An operator in Chromium opens the Schedules page from the menu: each demo schedule with its
cadence in words, zone and next fire times; pauses one, resumes it and runs it now, each through
the confirmation dialog, and follows the new run's link to its workflow, whose detail names the
schedule and tick. axe-core finds no serious violation on the page, light and dark, at 1280 and
390 px, and at 390 px the page does not scroll sideways."""

from __future__ import annotations

import re
from typing import Any

import pytest

from geneva_drive.examples import recurring
from tests.browser.conftest import login, screenshot
from tests.browser.test_accessibility import SCREENS, _context, _serious

pytestmark = pytest.mark.browser


@pytest.fixture
def scheduled(live_server: Any) -> int:
    return recurring.install()


def _confirm(page: Any, button: str, question: str) -> None:
    from playwright.sync_api import expect

    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(question)
    dialog.get_by_role("button", name=button).click()


def test_operator_pauses_resumes_and_runs_a_schedule_now(live_server, page, scheduled):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Schedules").click()
    page.wait_for_url(f"{base}/schedules")
    page.wait_for_load_state("load")
    expect(page.get_by_role("heading", level=1)).to_have_text("Schedules")
    expect(page.locator("#schedule-counts")).to_have_text("3 active · 1 paused · 0 disabled")
    nightly = page.locator('tr[data-schedule="nightly-report"]')
    expect(nightly).to_contain_text("At 03:00 every day")
    expect(nightly.locator(".fire-times li")).to_have_count(3)
    expect(nightly).to_contain_text("Europe/Berlin")
    expect(page.locator('tr[data-schedule="weekly-export"]')).to_contain_text("paused")
    screenshot(page, "schedules")

    probe = page.locator('tr[data-schedule="queue-probe"]')
    expect(probe).to_contain_text("every 30 s")
    probe.get_by_role("button", name="Pause", exact=True).click()
    _confirm(page, "Pause schedule queue-probe", "Pause schedule queue-probe?")
    expect(page.locator("#toasts")).to_contain_text("Paused schedule queue-probe")
    expect(probe.locator(".state")).to_contain_text("paused")

    probe.get_by_role("button", name="Resume", exact=True).click()
    _confirm(page, "Resume schedule queue-probe", "Ticks missed while it was paused")
    expect(page.locator("#toasts")).to_contain_text("Resumed schedule queue-probe")
    expect(probe.locator(".state")).to_contain_text("active")

    probe.get_by_role("button", name="Run now", exact=True).click()
    _confirm(page, "Run queue-probe now", "It creates one QueueProbeWorkflow workflow")
    expect(page.locator("#toasts")).to_contain_text("ran now: created QueueProbeWorkflow #")
    link = probe.locator(".last-run a")
    expect(link).to_have_text(re.compile(r"QueueProbeWorkflow #\d+"))
    workflow_id = int(re.search(r"#(\d+)", link.inner_text()).group(1))  # type: ignore[union-attr]
    link.click()
    page.wait_for_url(f"{base}/workflows/{workflow_id}")
    page.wait_for_load_state("load")
    expect(page.locator("#wf-schedule")).to_contain_text("created by schedule queue-probe")
    expect(page.locator("#wf-schedule")).to_contain_text("for the tick of")

    # Each action is in the audit log, the run linked to its workflow.
    page.get_by_role("link", name="Audit").click()
    rows = page.locator("#audit tbody tr")
    expect(rows.first).to_contain_text("schedule_run_now")
    expect(rows.first).to_contain_text(f"#{workflow_id}")
    expect(rows.nth(1)).to_contain_text("schedule_resume")
    expect(rows.nth(2)).to_contain_text("schedule_pause")


def test_schedules_page_passes_axe_light_and_dark_wide_and_narrow(live_server, browser, scheduled):
    base = live_server.url
    report = {}
    for scheme, width in SCREENS:
        for page in _context(browser, scheme, width):
            login(page, base, "olga")
            response = page.goto(f"{base}/schedules")
            assert response is not None and response.ok
            page.locator('tr[data-schedule="digest"]').wait_for()
            found = _serious(page)
            if found:
                report[f"{scheme} {width}px"] = found
            if width < 600:
                scroll = page.evaluate("() => document.documentElement.scrollWidth")
                assert scroll <= width, (scheme, scroll)
    assert not report, report
