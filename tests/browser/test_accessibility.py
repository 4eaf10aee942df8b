"""axe-core on every page of the demo, in the light and the dark scheme and at 390 px: no
serious or critical violation (dark-mode action buttons once failed contrast).

axe-core is vendored in tests/browser/vendor (from npm, MPL-2.0): nothing is fetched at test
time, and it is injected as an init script (Playwright runs those outside the page's CSP).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db, operator_actions
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, watch

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"

#: Every page (the workflow-detail kinds are added from the demo data by ``_pages``).
PAGES = [
    "/",
    "/workflows",
    "/workflows?due=overdue",
    "/workflows?state=paused",
    "/signals",
    "/definitions",
    "/definitions/OnboardingWorkflow",
    "/stranded",
    "/failures?window=7d",
    "/audit",
    "/limits",
    "/workflows?limit=tenant-sync&limit_key=acme.example",
    "/unexplained",
    "/workers",
    "/schedules",
]


def _one_id(*conditions: Any) -> int:
    with db.new_session() as session:
        found = session.scalar(select(Workflow.id).where(*conditions).order_by(Workflow.id))
    assert found is not None, conditions
    return int(found)


def _pages() -> list[str]:
    """The list pages plus one detail page of each kind an operator opens."""
    with db.new_session() as session:
        chain = session.scalar(
            select(StepExecution.workflow_id)
            .where(StepExecution.continues_from_id.is_not(None))
            .order_by(StepExecution.workflow_id)
        )
        waiting = session.scalar(
            select(StepExecution.workflow_id)
            .where(StepExecution.state == "waiting")
            .order_by(StepExecution.workflow_id)
        )
        stranded = session.scalar(
            select(StepExecution.workflow_id)
            .where(StepExecution.step_name == "send_sms", StepExecution.state == "failed")
            .order_by(StepExecution.workflow_id)
        )
    parent = _one_id(Workflow.id.in_(select(Workflow.parent_id)))
    details = [
        parent,
        _one_id(Workflow.parent_id == parent),
        _one_id(Workflow.state == "paused", Workflow.type == "FeedImportWorkflow"),
        int(stranded or 0),
        _one_id(Workflow.state == "finished"),
        _one_id(Workflow.state == "canceled"),
        _one_id(Workflow.state == "ready"),
        int(chain or 0),
        int(waiting or 0),
    ]
    heroes = ["/heroes/DemoCampaign/1"]
    batch = _bulk_batch()
    batches = [f"/workflows/bulk/{batch}", f"/audit?batch={batch}"]
    return (
        PAGES
        + [f"/workflows?parent={parent}"]
        + [f"/workflows/{i}" for i in details if i]
        + heroes
        + batches
    )


def _bulk_batch() -> int:
    """A finished bulk action, as the dashboard's confirm runs it: one paused, one refused (a
    finished workflow cannot be paused). The demo seeds none."""
    with db.new_session() as session:
        # The newest ready one: the detail pages above open the oldest of each state.
        ready = session.scalar(
            select(Workflow.id)
            .where(Workflow.state == "ready", Workflow.type == "OnboardingWorkflow")
            .order_by(Workflow.id.desc())
        )
        ids = [int(ready or 0), _one_id(Workflow.state == "finished")]
        result = operator_actions.perform_bulk(
            session, "olga", ids, "pause", {}, {"filters": {}, "scope": "selected"}
        )
    assert (result.done, result.refused) == (1, 1), result
    return int(result.audit_id)


def _serious(page: Any) -> list[str]:
    result = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ['violations']});
            return r.violations
              .filter(v => v.impact === 'serious' || v.impact === 'critical')
              .map(v => ({id: v.id, impact: v.impact,
                          nodes: v.nodes.slice(0, 4).map(n => n.target.join(' ') + ' :: '
                                 + (n.failureSummary || '').split('\\n').slice(1, 2).join(''))}));
        }"""
    )
    return [json.dumps(v) for v in result]


def _context(browser: Any, scheme: str, width: int) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": width, "height": 844 if width < 600 else 900}, color_scheme=scheme
    )
    context.add_init_script(path=str(AXE))
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    assert not errors, f"browser console errors or 5xx answers: {errors}"


#: Light and dark, wide and at 390 px (one demo for all four: seeding it is the slow part).
SCREENS = [("light", 1280), ("dark", 1280), ("light", 390), ("dark", 390)]


# About 40 pages, four times over: 150-290 s on a loaded 2-core box, beside the suite's 300 s
# default time limit.
@pytest.mark.timeout(900)
def test_axe_finds_no_serious_violation_on_any_page(live_server, browser):
    pages = _pages()
    report = {}
    for scheme, width in SCREENS:
        found = _audit(live_server.url, browser, scheme, width, pages)
        if found:
            report[f"{scheme} {width}px"] = found
    assert not report, json.dumps(report, indent=1)


def _audit(
    base: str, browser: Any, scheme: str, width: int, pages: list[str]
) -> dict[str, list[str]]:
    for page in _context(browser, scheme, width):
        login(page, base, "olga")
        found: dict[str, list[str]] = {}
        for path in pages:
            response = page.goto(base + path)
            # A page that is not there (a 404 for a wrong id) would pass axe vacuously.
            assert response is not None and response.ok, (path, response and response.status)
            # goto has waited for "load" (scripts and styles in); the pages load nothing after
            # it but their polls, so "networkidle" only added 500 ms of idle time per page.
            violations = _serious(page)
            if violations:
                found[path] = violations
        # The bulk preview dialog, open over the list.
        page.goto(f"{base}/workflows?class=PaymentWorkflow&state=ready")
        page.locator("input[name=ids]").first.check()
        if width < 600:  # the bulk bar starts folded on a phone
            page.locator("details.bulkbox > summary").click()
        page.get_by_role("button", name="Pause selected").click()
        page.locator("#bulk-count").wait_for()
        violations = _serious(page)
        if violations:
            found["bulk preview"] = violations
        # The login page, logged out.
        page.context.clear_cookies()
        page.goto(f"{base}/login")
        violations = _serious(page)
        if violations:
            found["/login"] = violations
    return found
