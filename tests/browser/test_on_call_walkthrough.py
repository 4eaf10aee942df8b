"""An on-call session, scripted: on the demo, every question is
answered within two clicks of the overview, and every fix is one click plus its confirmation,
with the result on screen without a reload (``window.__session`` survives: no page load)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, open_first

pytestmark = pytest.mark.browser


class Clicks:
    """Counts the operator's clicks since the overview."""

    def __init__(self, page: Any, base: str) -> None:
        self.page, self.base, self.n = page, base, 0

    def overview(self) -> None:
        self.page.goto(f"{self.base}/")
        self.n = 0

    def click(self, locator: Any) -> None:
        locator.click()
        self.n += 1

    def within_two(self) -> None:
        assert self.n <= 2, f"{self.n} clicks from the overview"


def _state(workflow_id: int) -> tuple[str, str | None]:
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        return workflow.state, workflow.next_step_name


def _id_of(page: Any) -> int:
    return int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]


def _no_reload(page: Any) -> None:
    page.evaluate("() => { window.__session = true; }")


def _still_no_reload(page: Any) -> None:
    assert page.evaluate("() => window.__session") is True, "the page was reloaded"


def test_on_call_session_two_clicks_to_answer_one_confirmed_click_to_fix(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    op = Clicks(page, base)

    # What failed most in the last hour: on the overview itself.
    op.overview()
    expect(page.locator("#overview-failures tbody tr").first).to_contain_text("ValueError")

    # What is paused and why: paused card → the list with the why line.
    op.click(page.locator("#stat-paused"))
    expect(page.locator("#results tbody tr").first).to_contain_text(
        re.compile(r"paused (after|by)|stranded")
    )
    op.within_two()

    # What waits for which signal and since when: waiting card → the inbox.
    op.overview()
    op.click(page.locator("#stat-waiting"))
    group = page.locator("#signals-inbox section.card").first
    expect(group.locator("h3")).to_contain_text("payment_confirmed")
    expect(
        group.locator("tbody tr").first.locator("td[data-label='Waiting since'] time")
    ).to_have_attribute("datetime", re.compile(r"Z$"))
    op.within_two()

    # What is overdue and by how much: overdue card → the list, each row with its lateness.
    op.overview()
    op.click(page.locator("#stat-overdue"))
    expect(page.locator("#results tbody tr").first).to_contain_text(re.compile(r"late by \d+"))
    op.within_two()

    # Which workflows are stranded: stranded card → the groups.
    op.overview()
    op.click(page.locator("#stat-stranded"))
    expect(page.locator("#stranded section.card").first).to_contain_text("send_sms")
    op.within_two()

    # How far a resumable chain got: class link → a campaign part-way through its chain.
    op.overview()
    op.click(page.get_by_role("link", name="CampaignWorkflow", exact=True))
    op.click(page.locator("#results tbody tr", has_text="deliver").first.locator("a").first)
    expect(page.locator("#timeline")).to_contain_text(re.compile(r"Resumable deliver: \d+ exec"))
    expect(page.locator("#timeline .chain-hops")).to_contain_text("+")
    op.within_two()

    # --- the fixes: one click (plus the confirmation), the result in place ---------------------

    # Resume (no confirmation needed: nothing is thrown away).
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=paused")
    open_first(page)
    workflow_id = _id_of(page)
    _no_reload(page)
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(page.locator("#wf-state")).to_have_text("ready")
    _still_no_reload(page)
    assert _state(workflow_id)[0] == "ready"

    # Skip, confirmed.
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    open_first(page)
    workflow_id = _id_of(page)
    _no_reload(page)
    page.get_by_role("button", name="Skip", exact=True).click()
    page.locator("#confirm-dialog").get_by_role("button", name=re.compile("^Skip the step")).click()
    expect(page.locator("#wf-state")).to_have_text("ready")
    _still_no_reload(page)
    assert _state(workflow_id) == ("ready", "publish")

    # Resume at a chosen step, confirmed.
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    open_first(page)
    workflow_id = _id_of(page)
    _no_reload(page)
    page.get_by_label("Step", exact=True).select_option("fetch")
    page.get_by_role("button", name="Resume at", exact=True).click()
    page.locator("#confirm-dialog").get_by_role(
        "button", name=f"Resume workflow #{workflow_id} at fetch"
    ).click()
    expect(page.locator("#wf-state")).to_have_text("ready")
    _still_no_reload(page)
    assert _state(workflow_id) == ("ready", "fetch")

    # Cancel, confirmed.
    page.goto(f"{base}/workflows?class=OnboardingWorkflow&state=ready")
    open_first(page)
    workflow_id = _id_of(page)
    _no_reload(page)
    page.get_by_role("button", name="Cancel", exact=True).click()
    page.locator("#confirm-dialog").get_by_role(
        "button", name=f"Cancel workflow #{workflow_id}"
    ).click()
    expect(page.locator("#wf-state")).to_have_text("canceled")
    _still_no_reload(page)
    assert _state(workflow_id)[0] == "canceled"

    # Deliver a signal to a parked, ready workflow from the inbox.
    page.goto(f"{base}/signals")
    _no_reload(page)
    row = page.locator("#signals-inbox section.card:not(.paused-group) tbody tr").first
    row_id = row.get_attribute("id")
    workflow_id = int((row_id or "waiter-0").removeprefix("waiter-"))
    row.locator("summary", has_text="Send signal").click()
    row.get_by_role("button", name="Send signal").click()
    expect(page.locator("#inbox-message")).to_contain_text("delivered")
    _still_no_reload(page)
    with db.new_session() as session:
        still_waiting = session.scalar(
            select(StepExecution.id).where(
                StepExecution.workflow_id == workflow_id, StepExecution.state == "waiting"
            )
        )
    assert still_waiting is None

    # Bulk resume-at of the stranded ones to a chosen step, confirmed.
    page.goto(f"{base}/stranded")
    _no_reload(page)
    group = page.locator("#stranded section.card", has_text="send_sms")
    group.get_by_label("Step", exact=True).select_option("nudge_profile")
    group.get_by_role("button", name="Resume selected at").click()
    page.locator("#bulk-dialog").get_by_role(
        "button", name=re.compile(r"^Resume \d+ workflows? at nudge_profile$")
    ).click()
    expect(page.locator("#bulk-done")).to_contain_text("done.")
    expect(page.locator("#stranded")).not_to_contain_text("send_sms")
    _still_no_reload(page)
