"""signal() racing the gate from two threads, each with its own session.

Both sides take the workflow row lock first (FOR UPDATE on PostgreSQL, the database write
lock on SQLite), so one of two orders happens: the gate parks and the delivery wakes the
parked execution, or the delivery buffers the signal and the gate attaches it. Either way the
signal is never lost and never attached twice.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, db, executor, step
from geneva_drive.models import Signal, StepExecution
from tests.backends import SERVER_ONLY_REASON, on_server_database
from tests.engine.helpers import make_order


def _on_server_database() -> bool:
    """PostgreSQL or MariaDB: real concurrency under row locks (tests/backends.py)."""
    return on_server_database()


runs: list[tuple[int, int]] = []
runs_lock = threading.Lock()


class RaceFlow(Workflow):
    @step(wait_for="go")
    def gated(self):
        with runs_lock:
            runs.append((self.id, self.received_signal.id))


def _new_workflow() -> tuple[int, int]:
    session = db.SessionFactory()
    try:
        hero = make_order(session)
        wf = RaceFlow.create(hero=hero, session=session)
        session.commit()
        return wf.id, wf.current_execution.id
    finally:
        session.close()


def _race_once(workflow_id: int, execution_id: int, errors: list[BaseException]) -> None:
    barrier = threading.Barrier(2)

    def gate() -> None:
        try:
            barrier.wait(10)
            time.sleep(random.random() * 0.003)
            executor.execute(execution_id)
        except BaseException as error:  # surfaced by the test
            errors.append(error)

    def deliver() -> None:
        session = db.SessionFactory()
        try:
            barrier.wait(10)
            time.sleep(random.random() * 0.003)
            session.get(Workflow, workflow_id).signal("go", payload={"wf": workflow_id})
            session.commit()
        except BaseException as error:
            errors.append(error)
        finally:
            session.close()

    threads = [threading.Thread(target=gate), threading.Thread(target=deliver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a racer hung (deadlock?)"


def _check(workflow_id: int, execution_id: int, transport) -> str:
    session = db.SessionFactory()
    try:
        execution = session.get(StepExecution, execution_id)
        order = "attached at the gate"
        if execution.state == "scheduled":
            # the gate parked first and the delivery woke it: a message went out for it
            assert execution.signal_id is not None
            assert execution_id in transport.execution_ids
            order = "parked, then woken"
            session.close()
            executor.execute(execution_id)  # the worker receiving the wake message
            session = db.SessionFactory()
            execution = session.get(StepExecution, execution_id)
        signal = session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).one()
        wf = session.get(Workflow, workflow_id)
        assert (execution.state, execution.outcome) == ("completed", "success"), order
        assert execution.signal_id == signal.id
        assert wf.state == "finished"
        assert (signal.state, signal.claimed, signal.consumed) == ("consumed", 1, 1), order
        executions = session.scalars(
            select(StepExecution).where(StepExecution.workflow_id == workflow_id)
        ).all()
        assert len(executions) == 1
        with runs_lock:
            assert [r for r in runs if r[0] == workflow_id] == [(workflow_id, signal.id)]
        return order
    finally:
        session.close()


def _race(rounds: int, transport) -> dict[str, int]:
    runs.clear()
    seen: dict[str, int] = {}
    for _ in range(rounds):
        workflow_id, execution_id = _new_workflow()
        errors: list[BaseException] = []
        _race_once(workflow_id, execution_id, errors)
        assert errors == []
        order = _check(workflow_id, execution_id, transport)
        seen[order] = seen.get(order, 0) + 1
    return seen


@pytest.mark.skipif(not _on_server_database(), reason=SERVER_ONLY_REASON)
def test_signal_and_gate_race_on_a_server_database(geneva_session, geneva_transport):
    seen = _race(50, geneva_transport)
    assert sum(seen.values()) == 50
    print("race orders:", seen)


def test_signal_and_gate_race_on_the_configured_database(geneva_session, geneva_transport):
    """A shorter run of the same race on whatever database the suite uses (SQLite too)."""
    seen = _race(10, geneva_transport)
    assert sum(seen.values()) == 10


def test_both_orders_are_handled(geneva_session, geneva_transport):
    """Force each order once, so both branches of the race are known to be exercised."""
    runs.clear()
    # gate first: parks, then the delivery wakes it
    workflow_id, execution_id = _new_workflow()
    executor.execute(execution_id)
    session = db.SessionFactory()
    try:
        assert session.get(StepExecution, execution_id).state == "waiting"
        session.get(Workflow, workflow_id).signal("go")
        session.commit()
    finally:
        session.close()
    assert _check(workflow_id, execution_id, geneva_transport) == "parked, then woken"
    # delivery first: buffered, then attached at the gate
    workflow_id, execution_id = _new_workflow()
    session = db.SessionFactory()
    try:
        session.get(Workflow, workflow_id).signal("go")
        session.commit()
    finally:
        session.close()
    executor.execute(execution_id)
    assert _check(workflow_id, execution_id, geneva_transport) == "attached at the gate"


def _send_concurrently(workflow_id: int, senders: int) -> list[Signal]:
    barrier = threading.Barrier(senders)
    results: list[Signal] = []
    errors: list[BaseException] = []

    def send(payload: int) -> None:
        session = db.SessionFactory()
        try:
            barrier.wait(10)
            signal = session.get(Workflow, workflow_id).signal(
                "go", payload={"n": payload}, idempotency_key="evt"
            )
            session.commit()
            results.append(signal)
        except BaseException as error:
            errors.append(error)
        finally:
            session.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    return results


@pytest.mark.skipif(not _on_server_database(), reason=SERVER_ONLY_REASON)
def test_concurrent_redeliveries_of_one_key_make_one_row(geneva_session):
    for _ in range(20):
        workflow_id, _execution_id = _new_workflow()
        results = _send_concurrently(workflow_id, 3)
        assert len({s.id for s in results}) == 1
        assert sorted(s.duplicate_delivery for s in results) == [False, True, True]
        first = next(s for s in results if not s.duplicate_delivery)
        assert all(s.payload == first.payload for s in results)
