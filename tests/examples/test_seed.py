"""The demo seed leaves workflows in every state the dashboard shows, through the real
executor, and runs once per database."""

from __future__ import annotations

from sqlalchemy import func, select

from geneva_drive.examples import seed
from geneva_drive.examples.onboarding import OnboardingWorkflow
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.workflow import Workflow


def test_small_seed_covers_every_state(geneva_session):
    created = seed.seed(scale=0.1)
    assert created >= 20
    s = geneva_session
    by_type = {
        (t, st): n
        for t, st, n in s.execute(
            select(Workflow.type, Workflow.state, func.count()).group_by(
                Workflow.type, Workflow.state
            )
        )
    }
    states = {st for _, st in by_type}
    assert {"ready", "paused", "finished", "canceled"} <= states
    assert by_type[("FeedImportWorkflow", "paused")] >= 1  # paused after an error
    assert by_type[("PaymentWorkflow", "paused")] >= 1  # paused by an operator
    for state in ("ready", "finished", "canceled"):  # grace period, erased, withdrawn
        assert by_type[("UserErasureWorkflow", state)] >= 1

    def executions(*conditions):
        return s.scalar(select(func.count()).select_from(StepExecution).where(*conditions))

    assert executions(StepExecution.state == "waiting") >= 1  # parked for payment_confirmed
    assert executions(StepExecution.error_class_name.like("%StepNotDefinedError")) >= 1
    assert executions(StepExecution.error_class_name == "ValueError") >= 1
    assert executions(StepExecution.outcome == "continued") >= 1  # a resumable chain
    assert executions(StepExecution.outcome == "reattempted") >= 1  # a flaky fetch
    assert (
        executions(StepExecution.state == "scheduled", StepExecution.scheduled_for < utcnow()) >= 1
    )  # overdue
    assert (
        executions(StepExecution.state == "scheduled", StepExecution.scheduled_for > utcnow()) >= 1
    )  # in the future
    assert OnboardingWorkflow.removed_steps_in_flight(s) == {"send_fax": 1}
    assert s.scalar(select(func.count()).select_from(Signal).where(Signal.state == "pending")) >= 1

    # Fan-out and join: an order whose invoice waits for its lines.
    waiting_parent = s.scalar(
        select(Workflow.id)
        .join(StepExecution, StepExecution.workflow_id == Workflow.id)
        .where(
            Workflow.type == "FulfilmentWorkflow",
            StepExecution.step_name == "invoice",
            StepExecution.state == "waiting",
        )
    )
    assert waiting_parent is not None
    lines = s.execute(
        select(Workflow.state, func.count())
        .where(Workflow.parent_id == waiting_parent)
        .group_by(Workflow.state)
    )
    assert dict(lines.all()) == {"finished": 3, "paused": 1, "ready": 1}
    assert by_type[("FulfilmentWorkflow", "finished")] >= 1

    assert seed.seed(scale=0.1) == 0  # already seeded
