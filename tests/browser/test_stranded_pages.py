"""Stranded workflows as an on-call operator meets them, in Chromium on the demo: the detail
of a workflow stranded on the deleted ``send_sms`` offers no Reattempt (a reattempt would run
another step than the one it stopped on), a stale Reattempt form is refused with the way out
and changes no row; ``/stranded`` shows where the missing step sat in the plan and preselects
the step after the gap. axe-core finds no serious violation on either page, light and dark,
at 1280 and 390 px."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import OperatorAction, StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login
from tests.browser.test_accessibility import SCREENS, _context, _serious

pytestmark = pytest.mark.browser


def _stranded_on_send_sms() -> int:
    with db.new_session() as session:
        workflow_id = session.scalar(
            select(StepExecution.workflow_id)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.step_name == "send_sms",
                StepExecution.state == "failed",
                Workflow.state == "paused",
            )
            .order_by(StepExecution.workflow_id)
        )
    assert workflow_id is not None, "the demo has workflows stranded on send_sms"
    return int(workflow_id)


def _rows(workflow_id: int) -> tuple[str, list[tuple[int, str, str]]]:
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        executions = [
            (e.id, e.step_name, e.state)
            for e in session.scalars(
                select(StepExecution)
                .where(StepExecution.workflow_id == workflow_id)
                .order_by(StepExecution.id)
            )
        ]
        return workflow.state, executions


def test_a_stranded_workflow_offers_resume_at_and_refuses_a_stale_reattempt(
    live_server: Any, page: Any
) -> None:
    from playwright.sync_api import expect

    workflow_id = _stranded_on_send_sms()
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows/{workflow_id}")
    actions = page.locator(".actions")
    expect(actions.get_by_role("button", name="Resume at")).to_be_visible()
    expect(actions.get_by_role("button", name="Reattempt", exact=True)).to_have_count(0)
    expect(actions.get_by_role("button", name="Resume", exact=True)).to_have_count(0)
    expect(page.locator("#wf-next-step")).to_contain_text("stranded on send_sms")

    # A form left open from before (another tab, a page the poll has not refreshed yet):
    # its confirmation promised to run "the current step", which no longer exists.
    before = _rows(workflow_id)
    page.evaluate(
        """([url]) => {
            const form = document.createElement('form');
            form.method = 'post';
            form.action = url;
            form.setAttribute('hx-post', url);
            form.setAttribute('hx-target', '#wf-live');
            form.setAttribute('hx-swap', 'outerHTML');
            form.innerHTML = '<button type="submit" id="stale-reattempt">Reattempt</button>';
            document.querySelector('#wf-live').appendChild(form);
            htmx.process(form);
        }""",
        [f"/workflows/{workflow_id}/reattempt"],
    )
    page.locator("#stale-reattempt").click()
    refusal = page.locator(".refusal")
    expect(refusal).to_contain_text(
        f"Cannot reattempt OnboardingWorkflow #{workflow_id}: step 'send_sms' is no longer "
        "defined in OnboardingWorkflow"
    )
    expect(refusal).to_contain_text("resume_at(step_name)")
    expect(page.locator("#main")).not_to_contain_text("Step scheduled to run again")
    assert _rows(workflow_id) == before
    with db.new_session() as session:
        audit = session.scalars(
            select(OperatorAction).where(OperatorAction.workflow_id == workflow_id)
        ).all()
        assert [(a.action, a.result) for a in audit] == [("reattempt", "refused")]


def test_stranded_shows_the_gap_and_preselects_the_step_after_it(
    live_server: Any, page: Any
) -> None:
    from playwright.sync_api import expect

    stranded = _stranded_on_send_sms()
    base = live_server.url
    login(page, base, "olga")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Stranded").click()
    page.wait_for_url(f"{base}/stranded")
    group = page.locator("section.card", has_text="send_sms")
    plan = group.get_by_role("list", name="Where send_sms sat in OnboardingWorkflow's steps:")
    expect(plan.locator("li")).to_have_text(
        [
            "send_welcome",
            "send_sms not defined: stranded here",
            "nudge_profile next after the gap",
            "send_fax removed (gravestone)",
            "send_tips",
            "ask_feedback",
        ],
        use_inner_text=True,
    )
    select_ = group.get_by_label("Step", exact=True)
    expect(select_).to_have_value("nudge_profile")

    # Confirming without touching the select resumes at the step after the gap.
    group.get_by_role("button", name="Resume selected at").click()
    confirm = page.locator("#bulk-dialog").get_by_role("button", name="at nudge_profile")
    expect(confirm).to_be_visible()
    confirm.click()
    expect(page.locator("#bulk-done")).to_contain_text("done.")
    expect(page.locator("#stranded")).not_to_contain_text("send_sms")
    state, executions = _rows(stranded)
    assert state == "ready"
    assert executions[-1][1:] == ("nudge_profile", "scheduled")


def test_the_stranded_pages_pass_axe_light_and_dark_wide_and_narrow(
    live_server: Any, browser: Any
) -> None:
    workflow_id = _stranded_on_send_sms()
    base = live_server.url
    report = {}
    for scheme, width in SCREENS:
        for page in _context(browser, scheme, width):
            login(page, base, "olga")
            for path in ("/stranded", f"/workflows/{workflow_id}"):
                response = page.goto(f"{base}{path}")
                assert response is not None and response.ok
                found = _serious(page)
                if found:
                    report[f"{path} {scheme} {width}px"] = found
                if width < 600:
                    scroll = page.evaluate("() => document.documentElement.scrollWidth")
                    assert scroll <= width, (path, scheme, scroll)
    assert not report, report
