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


def test_each_line_and_the_batch_agree(geneva_session):
    now = utcnow()
    due = _make(geneva_session)

    overdue = _make(geneva_session)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == overdue.id)
        .values(scheduled_for=now - timedelta(minutes=12))
    )

    parked = _make(geneva_session)
    perform_next_step(parked)
    perform_next_step(parked)

    later = _make(geneva_session)
    perform_next_step(later)
    perform_next_step(later)
    later.signal("approved")
    geneva_session.commit()
    perform_next_step(later)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == later.id, StepExecution.state == "scheduled")
        .values(scheduled_for=now + timedelta(hours=3, minutes=30))
    )
    geneva_session.commit()

    failed = _make(geneva_session)
    perform_next_step(failed)
    perform_next_step(failed)
    failed.signal("approved")
    geneva_session.commit()
    perform_next_step(failed)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == failed.id, StepExecution.state == "scheduled")
        .values(scheduled_for=now)
    )
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
    batch = why_waiting_many(geneva_session, workflows, now=now + timedelta(seconds=1))
    single = {w.id: why_waiting(w, now=now + timedelta(seconds=1)) for w in workflows}
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
