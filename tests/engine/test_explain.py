"""The why-is-it-waiting line (geneva_drive.explain): each sentence, and the batched form the
dashboard's lists use giving exactly the same lines as one workflow at a time."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from sqlalchemy import update

from geneva_drive import Workflow, removed_step, step
from geneva_drive.explain import why_waiting, why_waiting_many
from geneva_drive.models import OperatorAction, StepExecution, utcnow
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import make_order


class ExplainFlow(Workflow):
    @step
    def prepare(self) -> None:
        pass

    @step(wait_for="approved")
    def approve(self) -> None:
        pass

    @step(wait=timedelta(hours=3))
    def remind(self) -> None:
        raise RuntimeError("mail server down")

    gone = removed_step()


def _make(session) -> ExplainFlow:
    order = make_order(session)
    workflow = ExplainFlow.create(hero=order, session=session)
    session.commit()
    return workflow


def _pin(session, workflow_id: int, *, scheduled_for) -> None:
    """Set the due time of ``workflow_id``'s scheduled execution."""
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow_id, StepExecution.state == "scheduled")
        .values(scheduled_for=scheduled_for)
    )


def test_each_line_and_the_batch_agree(geneva_session):
    # The lines are read at a fixed instant, and every timestamp a line reads is pinned
    # relative to it once the setup is done: the setup may take seconds on a loaded machine,
    # and a line such as "due now" or "0 s ago" must not depend on how many.
    due = _make(geneva_session)

    overdue = _make(geneva_session)

    parked = _make(geneva_session)
    perform_next_step(parked)
    perform_next_step(parked)

    later = _make(geneva_session)
    perform_next_step(later)
    perform_next_step(later)
    later.signal("approved")
    geneva_session.commit()
    perform_next_step(later)

    failed = _make(geneva_session)
    perform_next_step(failed)
    perform_next_step(failed)
    failed.signal("approved")
    geneva_session.commit()
    perform_next_step(failed)
    _pin(geneva_session, failed.id, scheduled_for=utcnow())  # `remind` runs now, and fails
    geneva_session.commit()
    with contextlib.suppress(RuntimeError):
        perform_next_step(failed)

    by_operator = _make(geneva_session)
    by_operator.pause()
    geneva_session.add(
        OperatorAction(actor="alice", action="pause", workflow_id=by_operator.id, result="ok")
    )

    stranded = _make(geneva_session)
    stranded.pause()
    stranded.next_step_name = "vanished"

    finished = _make(geneva_session)
    finished.cancel()
    geneva_session.commit()

    # The instant the lines are read: after the setup, whatever it took.
    now = utcnow()
    _pin(geneva_session, due.id, scheduled_for=now)
    _pin(geneva_session, overdue.id, scheduled_for=now - timedelta(minutes=12))
    _pin(geneva_session, later.id, scheduled_for=now + timedelta(hours=3, minutes=30))
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == parked.id, StepExecution.state == "waiting")
        .values(waiting_since=now)
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == by_operator.id).values(transitioned_at=now)
    )
    geneva_session.commit()
    at = now + timedelta(milliseconds=500)

    expected = {
        due.id: "`prepare` due now",
        overdue.id: "`prepare` overdue by 12 min",
        parked.id: "waiting for signal `approved` since 0 s",
        later.id: "`remind` scheduled in 3 h",
        failed.id: "paused after `RuntimeError` in `remind`",
        by_operator.id: "paused by alice 0 s ago",
        stranded.id: "stranded: step `vanished` is no longer defined",
        finished.id: "canceled",
    }
    workflows = [due, overdue, parked, later, failed, by_operator, stranded, finished]
    for workflow in workflows:
        geneva_session.refresh(workflow)
    batch = why_waiting_many(geneva_session, workflows, now=at)
    single = {w.id: why_waiting(w, now=at) for w in workflows}
    assert single == expected
    assert batch == expected


def test_batch_costs_a_fixed_number_of_queries(geneva_session):
    from sqlalchemy import event

    workflows = [_make(geneva_session) for _ in range(6)]
    for workflow in workflows[:3]:
        workflow.pause()
    geneva_session.commit()
    for workflow in workflows:
        geneva_session.refresh(workflow)
    statements: list[str] = []
    engine = geneva_session.get_bind()

    def count(*args) -> None:  # type: ignore[no-untyped-def]
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", count)
    try:
        lines = why_waiting_many(geneva_session, workflows)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(lines) == 6
    assert len(statements) == 3  # current executions, last executions, last pause actions
