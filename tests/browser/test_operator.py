"""A real operator in Chromium, on the demo data: log in, filter to paused workflows, open one,
read the error, resume it at a chosen step, and watch the timeline update to completion while
the page polls. And a viewer, who can look but not act."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from geneva_drive import db, executor
from geneva_drive.models import StepExecution
from geneva_drive.states import StepState
from tests.browser.conftest import login, open_first, screenshot

pytestmark = pytest.mark.browser


def _run_current_execution(workflow_id: int) -> None:
    """What a worker would do: run the workflow's scheduled execution."""
    with db.new_session() as session:
        execution_id = session.scalar(
            select(StepExecution.id).where(
                StepExecution.workflow_id == workflow_id,
                StepExecution.state == StepState.SCHEDULED,
            )
        )
    assert execution_id is not None
    executor.execute(execution_id)


def test_operator_resumes_a_paused_workflow_at_a_chosen_step(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")

    # Filter to paused feed imports with the filter form (htmx swaps the results, the URL follows).
    page.get_by_role("link", name="Workflows").click()
    # The click waits only for the navigation to start; a select changed before the deferred
    # htmx script has run sends nothing (seen on a loaded machine), as in open_first.
    page.wait_for_load_state("load")
    page.get_by_label("Class", exact=True).select_option("FeedImportWorkflow")
    page.get_by_label("State", exact=True).select_option("paused")
    expect(page).to_have_url(re.compile(r"state=paused"))
    expect(page).to_have_url(re.compile(r"class=FeedImportWorkflow"))
    rows = page.locator("#results tbody tr")
    # Step and error names are <code>, not Markdown backticks.
    expect(rows.first).to_contain_text("paused after ValueError in parse")
    expect(rows.first.locator(".why code").first).to_have_text("ValueError")
    screenshot(page, "workflows-paused")

    # Open one and read the error.
    rows.first.get_by_role("link", name=re.compile(r"^#\d+$")).click()
    page.wait_for_load_state("load")
    expect(page.locator("#wf-title")).to_contain_text("FeedImportWorkflow")
    workflow_id = int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    error = page.locator(".error-block").first
    expect(error).to_contain_text("ValueError")
    expect(error).to_contain_text("malformed row 17")
    error.locator("summary", has_text="Backtrace").click()
    expect(error.locator("pre")).to_contain_text("Traceback")
    screenshot(page, "workflow-detail-paused")

    # Resume at a chosen step: the select lists runnable steps; the dialog repeats the label.
    page.get_by_label("Step", exact=True).select_option("publish")
    page.get_by_role("button", name="Resume at", exact=True).click()
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Resume workflow #{workflow_id} at publish?")
    screenshot(page, "confirm-dialog", full_page=False)
    dialog.get_by_role("button", name=f"Resume workflow #{workflow_id} at publish").click()
    expect(page.locator("#toasts")).to_contain_text("Resumed at publish.")
    expect(page.locator("#toasts code").last).to_have_text("publish")
    expect(page.locator("#wf-state")).to_have_text("ready")
    expect(page.locator("#timeline")).to_contain_text("Resume at")
    expect(page.locator("#timeline")).to_contain_text("by olga")

    # A worker runs the step; the polling page shows the workflow finish, then stops polling.
    _run_current_execution(workflow_id)
    expect(page.locator("#wf-state")).to_have_text("finished", timeout=10_000)
    expect(page.locator("#timeline")).to_contain_text("publish")
    expect(page.locator("#wf-live")).not_to_have_attribute("hx-trigger", re.compile("every"))
    assert page.get_by_role("button", name="Resume").count() == 0
    screenshot(page, "workflow-detail-finished")

    # The action is in the audit log too.
    page.get_by_role("link", name="Audit").click()
    expect(page.locator("#audit tbody tr").first).to_contain_text("Resume at")
    expect(page.locator("#audit tbody tr").first).to_contain_text("olga")


def test_engine_refusal_shows_next_to_the_control(live_server, page):
    """Two tabs on one workflow: the second click is refused by the engine, shown inline."""
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?state=paused&class=FeedImportWorkflow")
    open_first(page)
    detail_url = page.url
    # Working in a field pauses this tab's polling, so it keeps showing the paused workflow.
    page.get_by_label("Step", exact=True).focus()
    other = page.context.new_page()
    other.goto(detail_url)
    other.get_by_role("button", name="Resume", exact=True).click()
    expect(other.locator("#wf-state")).to_have_text("ready")
    other.close()

    # This tab still shows the paused workflow; its Resume is now refused (409).
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.get_by_role("button", name="Resume", exact=True).click()
    assert answer.value.status == 409
    expect(page.locator("#refusal")).to_contain_text("Only a paused workflow can be resumed")
    # The region now shows the workflow as it is: ready, with Pause offered instead.
    expect(page.locator("#wf-state")).to_have_text("ready")
    expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()


def test_viewer_can_look_but_not_act(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "vic")
    page.goto(f"{base}/workflows?state=paused")
    expect(page.locator("#results tbody tr").first).to_contain_text("paused")
    assert page.get_by_role("button", name="Pause selected").count() == 0
    open_first(page)
    expect(page.locator("#wf-title")).to_be_visible()
    for label in ("Pause", "Resume", "Skip", "Cancel", "Reattempt", "Resume at", "Send signal"):
        assert page.get_by_role("button", name=label, exact=True).count() == 0
    screenshot(page, "viewer-detail")

    # The server refuses the viewer even when the request is crafted by hand.
    token = page.evaluate(
        "() => JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRF-Token']"
    )
    workflow_id = re.search(r"/workflows/(\d+)", page.url).group(1)  # type: ignore[union-attr]
    response = page.request.post(
        f"{base}/workflows/{workflow_id}/resume", headers={"X-CSRF-Token": token}
    )
    assert response.status == 403


def test_a_poll_in_flight_when_the_operator_acts_is_neither_swapped_in_nor_aborted(
    live_server, page
):
    """The detail page polls every second. A poll rendered before the operator's Resume and
    answered after it must not put "paused" back on screen, and it must not be aborted
    either: htmx logs every abort as a console error (the ``page`` fixture fails on it), which
    an operator reading the console takes for a fault. Found as a flake of the on-call session
    on CI, where a Resume click met a poll in flight."""
    import threading

    from flask import request
    from playwright.sync_api import expect

    armed, held, release = threading.Event(), threading.Event(), threading.Event()

    def hold_one_poll(response):  # type: ignore[no-untyped-def]
        # after_request: the poll's page is rendered (workflow still paused); hold it back.
        is_poll = request.method == "GET" and request.headers.get("HX-Trigger") == "wf-live"
        if is_poll and armed.is_set():
            armed.clear()
            held.set()
            release.wait(30)
            response.headers["X-Held-Back"] = "1"
        return response

    live_server.app.after_request(hold_one_poll)
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=paused")
    open_first(page)
    workflow_id = int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    expect(page.locator("#wf-state")).to_have_text("paused")
    # The page's own XHR end, not an htmx event: htmx tells nobody about an answer whose
    # region the action's swap has already replaced. loadend follows htmx's load handler,
    # which swaps synchronously.
    page.evaluate(
        """() => { window.__heldPollDone = false;
          const send = XMLHttpRequest.prototype.send;
          XMLHttpRequest.prototype.send = function (...args) {
            this.addEventListener("loadend", () => {
              if (this.getResponseHeader("X-Held-Back")) {
                setTimeout(() => {
                  window.__stateAfterHeldPoll = document.getElementById("wf-state").textContent;
                  window.__heldPollDone = true;
                }, 0);
              }
            });
            return send.apply(this, args);
          }; }"""
    )

    armed.set()
    try:
        assert held.wait(15), "no poll came within 15 s"
        page.get_by_role("button", name="Resume", exact=True).click()
        expect(page.locator("#wf-state")).to_have_text("ready")
    finally:
        release.set()
    page.wait_for_function("() => window.__heldPollDone")
    # Read in the page right after the held poll was handled: a later poll would repair it.
    assert page.evaluate("() => window.__stateAfterHeldPoll") == "ready"
    expect(page.locator("#toasts")).to_contain_text("Resumed")
    with db.new_session() as session:
        from geneva_drive.workflow import Workflow

        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None and workflow.state == "ready"
