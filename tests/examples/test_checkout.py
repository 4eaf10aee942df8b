"""CheckoutWorkflow: waits for its payment at most PAYMENT_WINDOW; an abandoned checkout is
canceled by its time-out, a paid one ships. The demo seed leaves both, and checkouts still
waiting whose time-outs the running demo fires."""

from __future__ import annotations

from sqlalchemy import func, select

from geneva_drive.examples import seed
from geneva_drive.examples.checkout import PAYMENT_WINDOW, CheckoutWorkflow
from geneva_drive.examples.models import DemoOrder
from geneva_drive.models import StepExecution
from geneva_drive.testing import expire_wait, perform_next_step, speedrun_workflow
from geneva_drive.workflow import Workflow


def _parked(session):
    order = DemoOrder(amount_cents=4200, voided=False)
    session.add(order)
    session.flush()
    workflow = CheckoutWorkflow.create(hero=order, session=session)
    perform_next_step(workflow)
    perform_next_step(workflow)
    return workflow, order


def test_an_abandoned_checkout_is_canceled_by_its_time_out(geneva_session):
    workflow, _ = _parked(geneva_session)
    parked = workflow.current_execution
    assert parked.timeout_at == parked.waiting_since + PAYMENT_WINDOW
    assert workflow.why_waiting(parked.waiting_since).endswith(
        "times out in 1 min 15 s (then cancel)"
    )
    expire_wait(workflow)
    assert workflow.state == "canceled"
    assert workflow.execution_history[-1].outcome == "timed_out"


def test_a_paid_checkout_ships(geneva_session):
    workflow, order = _parked(geneva_session)
    workflow.signal("payment_confirmed", {"amount_cents": 4200}, idempotency_key="evt_1")
    geneva_session.commit()
    speedrun_workflow(workflow)
    assert (workflow.state, order.captured_cents) == ("finished", 4200)


def test_the_seed_leaves_abandoned_paid_and_waiting_checkouts(geneva_session):
    seed.seed(scale=0.1)
    states = dict(
        geneva_session.execute(
            select(Workflow.state, func.count())
            .where(Workflow.type == CheckoutWorkflow.workflow_name)
            .group_by(Workflow.state)
        ).all()
    )
    assert states["canceled"] >= 1 and states["finished"] >= 1 and states["ready"] >= 1
    timed_out = geneva_session.scalar(
        select(func.count()).select_from(StepExecution).where(StepExecution.outcome == "timed_out")
    )
    assert timed_out == states["canceled"]
    deadlines = geneva_session.scalars(
        select(StepExecution.timeout_at).where(
            StepExecution.state == "waiting", StepExecution.timeout_at.is_not(None)
        )
    ).all()
    assert len(deadlines) == states["ready"]
