"""A tenant floods ``tenant-sync`` in the demo (docs/MANUAL.md, "Concurrency and rate
limits"), and the operator finds it as at 3 a.m.: the overview names the limit that defers
most, /limits lists the flooding key first with its due and deferred executions, how long the
oldest has waited and a time to drain, and its link opens exactly the workflows under that
slot; the slot holders running far past their step's usual duration are flagged, the
deferred ones are late with the limit named, and a deferred workflow's detail says what it
waits for, with its key, never "overdue" nor "next start in 0 ms". axe-core finds nothing on
these pages, light and dark, at 1280 and 390 px."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.examples.seed import FLOOD_TENANT
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, screenshot
from tests.browser.test_accessibility import SCREENS, _context, _serious

pytestmark = pytest.mark.browser

SLOT = f"tenant-sync/{FLOOD_TENANT}"
#: The workflows list's page size in the tests' dashboard.
PAGE_SIZE = 50


def _flood() -> dict[str, set[int]]:
    """The flooding tenant's workflows by what their current execution does."""
    with db.new_session() as session:
        rows = session.execute(
            select(Workflow.id, StepExecution.state, StepExecution.deferred_on)
            .join(StepExecution, StepExecution.workflow_id == Workflow.id)
            .where(
                StepExecution.limit_slot == SLOT,
                StepExecution.state.in_(["scheduled", "in_progress"]),
            )
        ).all()
    return {
        "under": {r[0] for r in rows},
        "running": {r[0] for r in rows if r[1] == "in_progress"},
        "deferred": {r[0] for r in rows if r[2] is not None},
        "due": {r[0] for r in rows if r[1] == "scheduled" and r[2] is None},
    }


def test_operator_finds_the_flooding_tenant_from_the_overview(live_server, page):
    from playwright.sync_api import expect

    flood = _flood()
    waiting = len(flood["due"]) + len(flood["deferred"])
    assert flood["deferred"] and flood["due"] and len(flood["running"]) == 2

    base = live_server.url
    login(page, base, "olga")
    card = page.locator("#overview-limits")
    expect(card).to_contain_text("Limits holding work back")
    expect(card).to_contain_text(f"most behind key {FLOOD_TENANT} ({waiting} waiting)")
    card.get_by_role("link", name="tenant-sync").click()
    page.wait_for_url(f"{base}/limits#limit-tenant-sync")
    page.wait_for_load_state("load")

    limit = page.locator("#limit-tenant-sync")
    expect(limit).to_contain_text(f"{len(flood['deferred'])} late")
    first = limit.locator("tbody tr").first
    cells = first.locator("td")
    expect(cells.nth(0)).to_have_text(FLOOD_TENANT)
    expect(cells.nth(1)).to_have_text(str(waiting))
    expect(cells.nth(2)).to_contain_text(
        f"{len(flood['deferred'])} ({len(flood['deferred'])} late)"
    )
    expect(cells.nth(3)).to_have_text("2")
    expect(cells.nth(4)).to_have_text(re.compile(r"1[78] min ago"))
    expect(cells.nth(5)).to_contain_text(re.compile(r"about [0-9a-z ]+ \(6 finished in 10 min\)"))
    page.locator("#limits-help summary").click()
    expect(page.locator("#limits-help")).to_contain_text("finished in the last 10 min")
    screenshot(page, "limits-flood")

    first.get_by_role("link", name=FLOOD_TENANT).click()
    page.wait_for_url(f"{base}/workflows?limit=tenant-sync&limit_key={FLOOD_TENANT}")
    page.wait_for_load_state("load")
    rows = page.locator("tr[id^='wf-']")
    expect(rows).to_have_count(min(len(flood["under"]), PAGE_SIZE))
    shown = {int(i.removeprefix("wf-")) for i in rows.evaluate_all("rs => rs.map(r => r.id)")}
    assert shown <= flood["under"]
    # The two slot holders: pull usually takes milliseconds, these run for 17 minutes.
    page.get_by_label("State").select_option("performing")
    expect(rows).to_have_count(len(flood["running"]))
    for workflow_id in flood["running"]:
        row = page.locator(f"#wf-{workflow_id}")
        expect(row).to_contain_text("running long")
        expect(row).to_contain_text(re.compile(r"running pull for 1[78] min, far past its usual"))
    # The deferred ones are late, the limit named; none of them is "overdue".
    page.goto(f"{base}/workflows?limit=tenant-sync&due=held")
    expect(rows).to_have_count(min(len(flood["deferred"]), PAGE_SIZE))
    for workflow_id in sorted(flood["deferred"])[-10:]:
        row = page.locator(f"#wf-{workflow_id}")
        expect(row).to_contain_text(re.compile(r"late: held by tenant-sync for 1[78] min"))
        expect(row).to_contain_text(
            re.compile(
                rf"waiting for a slot of tenant-sync \[{re.escape(FLOOD_TENANT)}\] "
                r"\(2 of 2 in use\) since 1[78] min \(late\)"
            )
        )
        expect(row).not_to_contain_text("overdue")


def test_a_deferred_workflows_detail_says_what_it_waits_for_and_its_key(live_server, page):
    from playwright.sync_api import expect

    flood = _flood()
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?limit=tenant-sync&due=held")
    rows = page.locator("tr[id^='wf-']")
    expect(rows).to_have_count(len(flood["deferred"]))
    rows.first.locator("a").first.click()
    page.wait_for_load_state("load")
    main = page.locator("#main")
    expect(main).to_contain_text(
        re.compile(rf"waiting for a slot of tenant-sync \[{re.escape(FLOOD_TENANT)}\] since")
    )
    expect(main).to_contain_text(f"limit tenant-sync key {FLOOD_TENANT}")
    expect(main).not_to_contain_text("overdue")
    expect(main).not_to_contain_text("0 ms")


def test_flood_pages_pass_axe_light_and_dark_wide_and_narrow(live_server, browser):
    flood = _flood()
    base = live_server.url
    paths = [
        "/",
        "/limits",
        f"/workflows?limit=tenant-sync&limit_key={FLOOD_TENANT}",
        "/workflows?limit=tenant-sync&due=held",
        f"/workflows/{min(flood['deferred'])}",
        f"/workflows/{min(flood['running'])}",
    ]
    report = {}
    for scheme, width in SCREENS:
        for page in _context(browser, scheme, width):
            login(page, base, "olga")
            for path in paths:
                response = page.goto(base + path)
                assert response is not None and response.ok, path
                found = _serious(page)
                if found:
                    report[f"{scheme} {width}px {path}"] = found
                if width < 600:
                    scroll = page.evaluate("() => document.documentElement.scrollWidth")
                    assert scroll <= width, (scheme, path, scroll)
    assert not report, report
