"""What operators see of time-bounded waits (docs/MANUAL.md, "Time-bounded waits"): the
why-line with the time left and
the action, the signal inbox's time-out column (soonest first), the timed-out execution in the
timeline, and the ``due=timed_out`` filter of the workflows list."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from geneva_drive import Workflow, step
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import expire_wait, perform_next_step
from tests.engine.helpers import make_order


class DashTimeoutPayment(Workflow):
    @step(wait_for="payment_confirmed", timeout=timedelta(days=3), on_timeout="cancel")
    def capture(self) -> None:
        pass


class DashPatientPayment(Workflow):
    @step(wait_for="payment_confirmed")
    def capture(self) -> None:
        pass


def _parked(session, cls):
    workflow = cls.create(hero=make_order(session))
    session.commit()
    perform_next_step(workflow)
    return workflow


def _deadline(session, workflow, when):
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(timeout_at=when)
    )
    session.commit()


def test_the_why_line_says_when_the_wait_times_out(operator_client, geneva_session):
    workflow = _parked(geneva_session, DashTimeoutPayment)
    _deadline(geneva_session, workflow, utcnow() + timedelta(days=2, hours=22, minutes=30))
    html = operator_client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert "times out in 2 d 22 h (then cancel)" in html
    assert "timeout 3 days then cancel" in html  # the step plan's options
    listed = operator_client.get("/workflows?due=waiting").get_data(as_text=True)
    assert "times out in 2 d 22 h (then cancel)" in listed


def test_the_inbox_lists_the_soonest_time_out_first(operator_client, geneva_session):
    never = _parked(geneva_session, DashPatientPayment)  # parked first, no time-out
    later = _parked(geneva_session, DashTimeoutPayment)
    sooner = _parked(geneva_session, DashTimeoutPayment)
    _deadline(geneva_session, later, utcnow() + timedelta(days=2))
    _deadline(geneva_session, sooner, utcnow() + timedelta(hours=1))
    inbox = operator_client.get("/signals").get_data(as_text=True)
    assert '<th scope="col">Times out</th>' in inbox
    rows = [inbox.index(f'id="waiter-{w.id}"') for w in (sooner, later, never)]
    assert rows == sorted(rows), "soonest time-out first, waits without one last"
    assert "(then cancel)" in inbox and ">never<" in inbox


def test_timed_out_executions_show_in_the_timeline_and_the_filter(operator_client, geneva_session):
    timed_out = _parked(geneva_session, DashTimeoutPayment)
    waiting = _parked(geneva_session, DashTimeoutPayment)
    expire_wait(timed_out)
    detail = operator_client.get(f"/workflows/{timed_out.id}").get_data(as_text=True)
    assert "outcome timed_out" in detail and ">timed out</span>" in detail
    listed = operator_client.get("/workflows?due=timed_out").get_data(as_text=True)
    assert f'id="wf-{timed_out.id}"' in listed and f'id="wf-{waiting.id}"' not in listed
    assert '<option value="timed_out" selected>' in listed


def test_the_inbox_says_a_paused_waiters_time_out_is_held(operator_client, geneva_session):
    workflow = _parked(geneva_session, DashTimeoutPayment)
    workflow.pause()
    geneva_session.commit()
    inbox = operator_client.get("/signals").get_data(as_text=True)
    row = inbox[inbox.index(f'id="waiter-{workflow.id}"') :]
    assert "(then cancel; held while paused)" in row[: row.index("</tr>")]
