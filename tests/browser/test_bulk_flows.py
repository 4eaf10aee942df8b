"""Two bulk actions that were dead in the browser, driven to the end.

The earlier browser tests stopped at the preview ("N workflows will be …") and never clicked
its confirm button, and the list test only ever used the bulk bar's buttons, never its Step
select; both bugs lived exactly in the part no test performed. These tests do the whole flow:
choose a step that is not the first one, confirm, and read the result on screen and in the
rows it changed.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.dashboard.queries import WorkflowFilters, filtered_workflows
from geneva_drive.models import OperatorAction
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login

pytestmark = pytest.mark.browser


def _stranded_ids(cls: str, step: str) -> list[int]:
    with db.new_session() as session:
        stmt = filtered_workflows(WorkflowFilters(cls=cls, stranded=step))
        return sorted(w.id for w in session.scalars(stmt))


def _workflows(ids: list[int]) -> list[Workflow]:
    with db.new_session() as session:
        rows = list(session.scalars(select(Workflow).where(Workflow.id.in_(ids))))
        session.expunge_all()
        return rows


def test_stranded_bulk_resume_at_a_chosen_step(live_server, page):
    """/stranded: choose the third step, preview, confirm once; the group drains in place."""
    from playwright.sync_api import expect

    stranded = _stranded_ids("OnboardingWorkflow", "send_sms")
    assert stranded, "the demo has workflows stranded on send_sms"
    base = live_server.url
    login(page, base, "olga")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Stranded").click()
    page.wait_for_url(f"{base}/stranded")  # and its load: htmx before the next click (open_first)
    group = page.locator("section.card", has_text="send_sms")
    group.get_by_label("Step", exact=True).select_option("send_tips")
    group.get_by_role("button", name="Resume selected at").click()

    dialog = page.locator("#bulk-dialog")
    expect(dialog).to_be_visible()
    n = len(stranded)
    noun = "workflow" if n == 1 else "workflows"
    expect(page.locator("#bulk-count")).to_have_text(f"{n} {noun} will be resumed at send_tips.")
    # Exactly one confirm button on the screen, and it names what it does.
    confirm = dialog.get_by_role("button", name=f"Resume {n} {noun} at send_tips")
    expect(confirm).to_be_visible()
    confirm.click()

    expect(page.locator("#bulk-done")).to_contain_text(f"Resume selected at: {n} done.")
    # The page behind the dialog shows the drained group without a reload.
    expect(page.locator("#stranded")).not_to_contain_text("send_sms")
    for workflow in _workflows(stranded):
        assert workflow.state == "ready", (workflow.id, workflow.state)
        assert workflow.next_step_name == "send_tips", (workflow.id, workflow.next_step_name)
    with db.new_session() as session:
        batch = session.scalars(
            select(OperatorAction).where(OperatorAction.action == "bulk_resume_at")
        ).one()
        assert batch.actor == "olga" and batch.result == "ok"
        assert (batch.params or {})["step"] == "send_tips"
    page.get_by_role("button", name="Close").click()
    expect(page.locator("#bulk-dialog")).to_be_hidden()


def test_list_bulk_resume_at_a_non_first_step(live_server, page):
    """/workflows: choosing the bulk Step keeps the selection; the chosen step is the one used."""
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    rows = page.locator("#results tbody tr")
    expect(rows.first).to_contain_text("paused after")
    boxes = page.locator("input[name=ids]")
    first, second = (int(boxes.nth(i).get_attribute("value") or 0) for i in (0, 1))
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.locator("#bulk-form").get_by_label("Step", exact=True).select_option("publish")
    # Give a (wrongly triggered) filter reload time to land, then check nothing was lost.
    page.wait_for_timeout(1500)
    expect(page.locator("#bulk-step")).to_have_value("publish")
    expect(boxes.nth(0)).to_be_checked()
    expect(boxes.nth(1)).to_be_checked()
    page.get_by_role("button", name="Resume selected at").click()
    expect(page.locator("#bulk-count")).to_have_text("2 workflows will be resumed at publish.")
    page.locator("#bulk-dialog").get_by_role("button", name="Resume 2 workflows at publish").click()
    expect(page.locator("#bulk-done")).to_contain_text("Resume selected at: 2 done.")
    for workflow in _workflows([first, second]):
        assert workflow.state == "ready"
        assert workflow.next_step_name == "publish"
    # The list behind the dialog no longer shows them as paused.
    page.get_by_role("button", name="Close").click()
    expect(page.locator(f"#wf-{first}")).to_have_count(0)
    expect(page).to_have_url(re.compile(r"state=paused"))
