"""PaymentWorkflow: parks for the ``payment_confirmed`` webhook, deduplicates a redelivered
webhook by its idempotency key, and cancels when the order is voided."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from geneva_drive.examples.models import DemoOrder
from geneva_drive.examples.payment import PaymentWorkflow
from geneva_drive.models import Signal
from geneva_drive.testing import (
    assert_signal_state,
    assert_step_executed,
    assert_waiting_for_signal,
    assert_workflow_state,
    perform_next_step,
    speedrun_workflow,
)


def _start(session, amount_cents=4200):
    order = DemoOrder(amount_cents=amount_cents, voided=False)
    session.add(order)
    session.flush()
    return PaymentWorkflow.create(hero=order, session=session), order


def _park(workflow):
    """authorize, then the capture reaches its gate and parks."""
    assert perform_next_step(workflow).step_name == "authorize"
    assert perform_next_step(workflow).step_name == "capture"
    assert_waiting_for_signal(workflow, "payment_confirmed")


def _signals(session, workflow):
    return session.scalar(
        select(func.count()).select_from(Signal).where(Signal.workflow_id == workflow.id)
    )


def test_parks_until_the_webhook_then_captures_the_confirmed_amount(geneva_session):
    wf, order = _start(geneva_session, amount_cents=4200)
    _park(wf)
    assert wf.state == "ready"
    assert_step_executed(wf, "authorize")
    with pytest.raises(RuntimeError, match="parked"):
        speedrun_workflow(wf)
    geneva_session.refresh(order)
    assert order.captured_cents is None

    # The provider confirms a different amount than authorized: the captured one is the signal's.
    first = wf.signal("payment_confirmed", {"amount_cents": 3900}, idempotency_key="evt_1")
    geneva_session.commit()
    assert first.duplicate_delivery is False

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    assert_step_executed(wf, "capture")
    assert_step_executed(wf, "send_receipt")
    assert_signal_state(wf, "payment_confirmed", "consumed")
    geneva_session.refresh(order)
    assert order.captured_cents == 3900


def test_a_redelivered_webhook_is_deduplicated_by_its_idempotency_key(geneva_session):
    wf, order = _start(geneva_session)
    _park(wf)
    first = wf.signal("payment_confirmed", {"amount_cents": 4200}, idempotency_key="evt_7")
    # The provider retries the same event (with a different body, even): no second signal.
    again = wf.signal("payment_confirmed", {"amount_cents": 9999}, idempotency_key="evt_7")
    geneva_session.commit()
    assert again.duplicate_delivery is True
    assert again.id == first.id
    assert _signals(geneva_session, wf) == 1

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    geneva_session.refresh(order)
    assert order.captured_cents == 4200  # the first delivery's payload

    # A retry arriving after the workflow finished is still acknowledged, not an error.
    late = wf.signal("payment_confirmed", {"amount_cents": 4200}, idempotency_key="evt_7")
    assert late.duplicate_delivery is True
    assert _signals(geneva_session, wf) == 1


def test_a_signal_delivered_before_the_gate_is_buffered(geneva_session):
    wf, order = _start(geneva_session, amount_cents=1500)
    wf.signal("payment_confirmed", {"amount_cents": 1500}, idempotency_key="evt_early")
    geneva_session.commit()
    assert_signal_state(wf, "payment_confirmed", "pending")
    speedrun_workflow(wf)  # never parks: the buffered signal is taken at the gate
    assert_workflow_state(wf, "finished")
    geneva_session.refresh(order)
    assert order.captured_cents == 1500


def test_a_voided_order_cancels_the_payment(geneva_session):
    wf, order = _start(geneva_session)
    _park(wf)
    order.voided = True
    geneva_session.commit()
    wf.signal("payment_confirmed", {"amount_cents": 4200}, idempotency_key="evt_void")
    geneva_session.commit()
    speedrun_workflow(wf)
    assert_workflow_state(wf, "canceled")
    assert_step_executed(wf, "capture", "canceled")
    geneva_session.refresh(order)
    assert order.captured_cents is None
