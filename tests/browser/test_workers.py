"""An operator in Chromium opens the Workers page from the menu: live workers with the steps
they run, a live worker on another code version flagged, an expired worker still holding a
step highlighted; following a running step's link opens that workflow, whose why-line names
the worker. axe-core finds no serious violation on the page, light and dark, at 1280 and
390 px, and at 390 px the page does not scroll sideways."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update

from geneva_drive import db, liveness
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import expire_worker
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, screenshot
from tests.browser.test_accessibility import SCREENS, _context, _serious

pytestmark = pytest.mark.browser


def _register(name: str, version: str, monkeypatch: Any) -> int:
    monkeypatch.setenv("GENEVA_CODE_VERSION", version)
    return liveness.register("celery", ["default", "mail"], name=name).worker_id


def _run_two_steps(live: int, dead: int) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """Two ready demo workflows whose scheduled step now runs: one on ``live``, one on
    ``dead``. Returns (workflow id, class, step) of each."""
    with db.transaction() as session:
        rows = session.execute(
            select(StepExecution.id, Workflow.id, Workflow.type, StepExecution.step_name)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(Workflow.state == "ready", StepExecution.state == "scheduled")
            .order_by(Workflow.id)
            .limit(2)
        ).all()
        assert len(rows) == 2, rows
        for (execution_id, workflow_id, _, _), worker_id in zip(rows, (live, dead), strict=True):
            session.execute(
                update(StepExecution)
                .where(StepExecution.id == execution_id)
                .values(state="in_progress", started_at=utcnow(), worker_id=worker_id)
            )
            session.execute(
                update(Workflow).where(Workflow.id == workflow_id).values(state="performing")
            )
    (_, first, first_class, first_step), (_, second, second_class, second_step) = rows
    return (first, first_class, first_step), (second, second_class, second_step)


@pytest.fixture
def fleet(live_server: Any, monkeypatch: Any) -> dict[str, Any]:
    live = _register("celery@web-1/812", "v7", monkeypatch)
    _register("celery@web-1/813", "v7", monkeypatch)
    behind = _register("celery@web-2/40", "v6", monkeypatch)
    dead = _register("celery@web-3/9", "v7", monkeypatch)
    running, orphaned = _run_two_steps(live, dead)
    expire_worker(dead)
    return {"live": live, "behind": behind, "dead": dead, "running": running, "orphan": orphaned}


def test_operator_sees_the_workers_and_follows_a_running_step(live_server, page, fleet):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Workers").click()
    page.wait_for_url(f"{base}/workers")
    page.wait_for_load_state("load")
    expect(page.get_by_role("heading", level=1)).to_have_text("Workers")
    expect(page.locator("#worker-counts")).to_have_text("3 live · 1 expired · 0 stopped")

    live = page.locator(f"#worker-{fleet['live']}")
    expect(live).to_contain_text("celery@web-1/812")
    expect(live).to_contain_text("live")
    expect(live).to_contain_text("default, mail")
    expect(page.locator(f"#worker-{fleet['behind']}")).to_contain_text("deploy in progress")
    expect(page.locator("#workers-versions")).to_contain_text("most run v7")
    dead = page.locator(f"#worker-{fleet['dead']}")
    expect(dead).to_have_class("recovering")
    expect(dead).to_contain_text("expired")
    expect(dead).to_contain_text("recovered at the next sweep")
    expect(page.locator("#workers-recovering")).to_contain_text("1 expired worker still holds")
    screenshot(page, "workers")

    workflow_id, workflow_class, step_name = fleet["running"]
    live.get_by_role("link", name=f"{workflow_class} #{workflow_id}").click()
    page.wait_for_url(f"{base}/workflows/{workflow_id}")
    page.wait_for_load_state("load")
    expect(page.locator("#wf-title")).to_contain_text(workflow_class)
    expect(page.locator("#main")).to_contain_text(f"running {step_name} on celery@web-1/812 for")


def test_workers_page_passes_axe_light_and_dark_wide_and_narrow(live_server, browser, fleet):
    base = live_server.url
    report = {}
    for scheme, width in SCREENS:
        for page in _context(browser, scheme, width):
            login(page, base, "olga")
            response = page.goto(f"{base}/workers")
            assert response is not None and response.ok
            page.locator(f"#worker-{fleet['dead']}").wait_for()
            found = _serious(page)
            if found:
                report[f"{scheme} {width}px"] = found
            if width < 600:
                scroll = page.evaluate("() => document.documentElement.scrollWidth")
                assert scroll <= width, (scheme, scroll)
    assert not report, report
