"""An operator in Chromium watches a demo checkout's wait time out (docs/MANUAL.md,
"Time-bounded waits"): the why-line
counts down "— times out in … (then cancel)", the real sweep (the loop ``geneva-drive up``
runs beside the embedded worker) fires the time-out, and the page, polling, changes to
"canceled" with the timed-out execution in the timeline; the signal inbox lists the checkout
with its time-out."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from geneva_drive import db
from geneva_drive.dispatch import run_dispatcher
from geneva_drive.examples.checkout import CheckoutWorkflow
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, screenshot

pytestmark = pytest.mark.browser


def _waiting_checkout() -> tuple[int, int]:
    with db.new_session() as session:
        row = session.execute(
            select(Workflow.id, StepExecution.id)
            .join(StepExecution, StepExecution.workflow_id == Workflow.id)
            .where(
                Workflow.type == CheckoutWorkflow.workflow_name,
                Workflow.state == "ready",
                StepExecution.state == "waiting",
            )
            .order_by(Workflow.id)
            .limit(1)
        ).one()
        return row[0], row[1]


def test_operator_watches_a_checkout_time_out(live_server, page, frozen_clock):
    """The clock is held (``frozen_clock``) and moved past the deadline by the test: with
    the real one, a loaded machine spent the 8 s left before the page showed "times out in"."""
    from playwright.sync_api import expect

    workflow_id, execution_id = _waiting_checkout()
    # The demo's window is 75 s; the test lets only a few seconds of it remain.
    with db.transaction() as session:
        session.execute(
            update(StepExecution)
            .where(StepExecution.id == execution_id)
            .values(timeout_at=frozen_clock.now + timedelta(seconds=8))
        )

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/signals")
    row = page.locator(f"#waiter-{workflow_id}")
    expect(row).to_contain_text("(then cancel)")
    expect(page.locator("#signals-inbox th", has_text="Times out").first).to_be_visible()

    page.goto(f"{base}/workflows/{workflow_id}")
    why = page.locator("#why-line")
    expect(why).to_contain_text("waiting for signal payment_confirmed since")
    expect(why).to_contain_text("— times out in")
    expect(why).to_contain_text("(then cancel)")
    screenshot(page, "workflow-detail-times-out")

    frozen_clock.advance(timedelta(seconds=9))  # the deadline passes
    stop = threading.Event()
    sweep = threading.Thread(
        target=run_dispatcher,
        args=(stop,),
        kwargs={"interval": 0.5, "housekeeping": False, "dispatch": False},
        daemon=True,
    )
    sweep.start()
    try:
        expect(page.locator("#wf-state")).to_have_text("canceled", timeout=30_000)
    finally:
        stop.set()
        sweep.join(10)
    # A canceled workflow's line says why it ended (docs/MANUAL.md, "Time-bounded waits").
    expect(why).to_have_text(
        re.compile(r"^timed out waiting for payment_confirmed after [0-9a-z ]+ \(then cancel\)$")
    )
    expect(page.locator(f"#exec-{execution_id}")).to_contain_text("outcome timed_out")
    expect(page.locator(f"#exec-{execution_id}")).to_contain_text("timed out")
    screenshot(page, "workflow-detail-timed-out")

    page.goto(f"{base}/workflows?due=timed_out&class={CheckoutWorkflow.workflow_name}")
    expect(page.locator(f"#wf-{workflow_id}")).to_be_visible()
