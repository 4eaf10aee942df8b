"""A step's finalize chosen as a deadlock victim (PostgreSQL and MariaDB) records its outcome
again instead of leaving the execution in progress for housekeeping.

The deadlock is a real one: while finalize holds the workflow's row, a second connection holds
the hero's row and then asks for the workflow's, after finalize has asked for the hero's. The
second connection has written more rows, so InnoDB (which rolls back the transaction with fewer
changed rows) and PostgreSQL (whose first waiter finds the cycle) both pick finalize.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.executor import execute
from geneva_drive.instrumentation import EVENTS, set_error_reporter
from tests.backends import SERVER_ONLY_REASON, lock_waiters, on_server_database
from tests.conftest import Order
from tests.engine.helpers import executions, other_session

pytestmark = pytest.mark.skipif(not on_server_database(), reason=SERVER_ONLY_REASON)

ran: list[str] = []


class DeadlockedPayment(Workflow):
    @step
    def charge(self) -> None:
        ran.append("charge")

    @step
    def receipt(self) -> None:
        ran.append("receipt")


def _wait_for_a_lock_waiter(timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    with other_session() as monitor:
        while time.monotonic() < deadline:
            if lock_waiters(monitor):
                return
            monitor.rollback()
            time.sleep(0.02)
    raise TimeoutError("nobody waited for a lock")


def _run_with_a_deadlocked_finalize(
    session: Session, workflow: Workflow, order_id: int, step_name: str
) -> None:
    """Run the workflow's ``step_name`` execution; its first finalize loses a real deadlock
    over the workflow's row and its hero's (``order_id``)."""
    workflow_id = workflow.id
    execution_id = executions(session, workflow, step_name)[0].id
    worker = Session(bind=session.get_bind(), expire_on_commit=False)
    holding = threading.Event()
    errors: list[BaseException] = []
    deadlocks = 0

    def hold_the_hero_then_ask_for_the_workflow() -> None:
        try:
            with other_session() as other_session_:
                other_session_.add_all(Order(status="filler") for _ in range(20))
                other_session_.flush()
                other_session_.execute(
                    select(Order.id).where(Order.id == order_id).with_for_update()
                )
                holding.set()
                _wait_for_a_lock_waiter()  # finalize, asking for the hero's row
                other_session_.execute(
                    select(Workflow.id).where(Workflow.id == workflow_id).with_for_update()
                )
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    other = threading.Thread(target=hold_the_hero_then_ask_for_the_workflow)

    def in_finalize(_sender: object, **payload: object) -> None:
        nonlocal deadlocks
        if payload.get("workflow_id") != workflow_id or other.is_alive() or deadlocks:
            return
        deadlocks += 1
        other.start()
        assert holding.wait(20)
        # Under finalize's lock on the workflow's row: waits for the hero's, held by `other`.
        worker.execute(select(Order.id).where(Order.id == order_id).with_for_update())

    EVENTS["finalize"].connect(in_finalize)
    try:
        execute(execution_id, session=worker)
    finally:
        EVENTS["finalize"].disconnect(in_finalize)
        other.join(30)
        worker.close()
        session.expire_all()
    assert deadlocks == 1
    assert errors == []


def test_a_finalize_chosen_as_deadlock_victim_records_its_outcome_again(
    geneva_session, order, caplog
):
    ran.clear()
    workflow = DeadlockedPayment.create(hero=order)
    geneva_session.commit()
    with caplog.at_level(logging.WARNING, logger="geneva_drive"):
        _run_with_a_deadlocked_finalize(geneva_session, workflow, order.id, "charge")
    assert ran == ["charge"]
    assert "deadlock victim" in caplog.text
    assert workflow.state == "ready" and workflow.next_step_name == "receipt"
    [charge] = executions(geneva_session, workflow, "charge")
    assert (charge.state, charge.outcome) == ("completed", "success")
    assert [e.state for e in executions(geneva_session, workflow, "receipt")] == ["scheduled"]


class DeclinedPayment(Workflow):
    @step(on_exception="pause")
    def charge(self) -> None:
        raise RuntimeError("card declined")


def test_a_failed_step_whose_finalize_lost_a_deadlock_is_reported_once(geneva_session, order):
    reported: list[tuple[BaseException, dict[str, object]]] = []
    set_error_reporter(lambda error, context: reported.append((error, context)))
    try:
        workflow = DeclinedPayment.create(hero=order)
        geneva_session.commit()
        with pytest.raises(RuntimeError, match="card declined"):
            _run_with_a_deadlocked_finalize(geneva_session, workflow, order.id, "charge")
    finally:
        set_error_reporter(None)
    assert [str(error) for error, _context in reported] == ["card declined"]
    assert workflow.state == "paused"
    [charge] = executions(geneva_session, workflow, "charge")
    assert charge.state == "failed" and charge.error_message == "card declined"
