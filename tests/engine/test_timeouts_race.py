"""A time-out racing a signal, and dispatchers racing each other, from real threads.

Every writer of a parked execution takes the workflow lock first (FOR UPDATE on PostgreSQL
and MariaDB, the database write lock on SQLite) and rechecks that the execution still waits,
so whichever commits first wins and the other sees it: a signal that wins leaves nothing to
time out; a time-out that wins leaves the signal buffered (pending). Several dispatchers fire
each time-out exactly once. Runs on every backend (SQLite serializes the racers).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from geneva_drive import Workflow, db, scheduling, step, timeouts
from geneva_drive.dispatch import dispatch_due, fire_timeouts
from geneva_drive.instrumentation import wait_timed_out
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import create_workflow
from tests.reliability.invariants import assert_invariants


class RaceTimeoutFlow(Workflow):
    @step(wait_for="paid", timeout=timedelta(hours=1), on_timeout="run")
    def capture(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


@pytest.fixture
def fired():
    events: list[int] = []
    lock = threading.Lock()

    def receiver(sender, **payload):
        with lock:
            events.append(payload["execution_id"])

    wait_timed_out.connect(receiver)
    yield events
    wait_timed_out.disconnect(receiver)


def _parked_past_deadline(session) -> tuple[int, int]:
    """A workflow parked at ``capture`` whose deadline has just passed: (workflow, execution)."""
    workflow = create_workflow(session, RaceTimeoutFlow)
    perform_next_step(workflow)
    parked = session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == workflow.id)
    ).one()
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == parked.id)
        .values(timeout_at=utcnow() - timedelta(seconds=1))
    )
    session.commit()
    return workflow.id, parked.id


def _deliver(
    workflow_id: int,
    errors: list[BaseException],
    hold: threading.Event | None = None,
    holding: threading.Event | None = None,
):
    """Signal the workflow; with ``hold``, keep the transaction (and the workflow lock the
    signal took) open until it is set, after setting ``holding``."""
    session = db.new_session()
    try:
        session.get(Workflow, workflow_id).signal("paid", payload={"amount": 1})
        if holding is not None:
            holding.set()
        if hold is not None:
            hold.wait(30)
        session.commit()
    except BaseException as error:
        errors.append(error)
    finally:
        session.close()


def _outcome(session, workflow_id: int, execution_id: int) -> tuple[str, str, int | None]:
    session.expire_all()
    execution = session.get(StepExecution, execution_id)
    signal = session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).one()
    return execution.state, signal.state, execution.signal_id


def _join(threads: list[threading.Thread], errors: list[BaseException]) -> None:
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a racer hung (deadlock?)"
    assert errors == []


def test_signal_committed_first_wins_and_the_time_out_sees_it(geneva_session, fired):
    workflow_id, execution_id = _parked_past_deadline(geneva_session)
    errors: list[BaseException] = []
    holding, release = threading.Event(), threading.Event()
    signaller = threading.Thread(target=_deliver, args=(workflow_id, errors, release, holding))
    signaller.start()
    # The signal holds the workflow lock, its transaction open (a fixed sleep here let a
    # loaded machine start the sweep first, which then rightly won).
    assert holding.wait(30)
    sweeper = threading.Thread(target=lambda: fire_timeouts())
    sweeper.start()
    # Give the sweep time to queue on the lock. The outcome does not depend on it: a sweep
    # that reaches the lock only after the commit sees the signal too.
    time.sleep(0.3)
    release.set()
    _join([signaller, sweeper], errors)
    fire_timeouts()  # and any later sweep
    assert fired == []
    state, signal_state, signal_id = _outcome(geneva_session, workflow_id, execution_id)
    assert (state, signal_state) == ("scheduled", "claimed") and signal_id is not None
    assert_invariants(geneva_session)


def test_time_out_committed_first_wins_and_the_signal_is_buffered(geneva_session, fired):
    workflow_id, execution_id = _parked_past_deadline(geneva_session)
    errors: list[BaseException] = []
    locked, release = threading.Event(), threading.Event()

    def sweep_and_hold() -> None:
        session = db.new_session()
        try:
            workflow = session.get(Workflow, workflow_id)
            scheduling.lock_workflow(session, workflow)
            assert timeouts.fire_due(session, workflow, utcnow())
            locked.set()
            release.wait(30)
            session.commit()
        except BaseException as error:
            errors.append(error)
            locked.set()
        finally:
            session.close()

    sweeper = threading.Thread(target=sweep_and_hold)
    sweeper.start()
    assert locked.wait(30)
    signaller = threading.Thread(target=_deliver, args=(workflow_id, errors))
    signaller.start()
    # Give the signal time to queue on the lock. The outcome does not depend on it: a signal
    # that reaches the lock only after the time-out's commit is buffered all the same.
    time.sleep(0.3)
    release.set()
    _join([sweeper, signaller], errors)
    assert fired == [execution_id]
    state, signal_state, signal_id = _outcome(geneva_session, workflow_id, execution_id)
    assert (state, signal_state, signal_id) == ("scheduled", "pending", None)
    assert geneva_session.get(StepExecution, execution_id).timed_out_at is not None
    assert_invariants(geneva_session)


def test_signal_and_time_out_racing_from_a_barrier_have_exactly_one_winner(geneva_session, fired):
    rounds = 12
    winners: Counter[str] = Counter()
    for _ in range(rounds):
        workflow_id, execution_id = _parked_past_deadline(geneva_session)
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def sweep(barrier: threading.Barrier = barrier, errors: list = errors) -> None:
            try:
                barrier.wait(10)
                time.sleep(random.random() * 0.003)
                fire_timeouts()
            except BaseException as error:
                errors.append(error)

        def signal(
            workflow_id: int = workflow_id,
            barrier: threading.Barrier = barrier,
            errors: list = errors,
        ) -> None:
            barrier.wait(10)
            time.sleep(random.random() * 0.003)
            _deliver(workflow_id, errors)

        threads = [threading.Thread(target=sweep), threading.Thread(target=signal)]
        for thread in threads:
            thread.start()
        _join(threads, errors)
        fire_timeouts()  # a time-out skipped under a lock fires now, unless the signal won
        state, signal_state, signal_id = _outcome(geneva_session, workflow_id, execution_id)
        timed_out = fired.count(execution_id)
        assert state == "scheduled"
        if signal_id is not None:
            assert (timed_out, signal_state) == (0, "claimed")
            winners["signal"] += 1
        else:
            assert (timed_out, signal_state) == (1, "pending")
            winners["time-out"] += 1
        assert_invariants(geneva_session)
    assert sum(winners.values()) == rounds


@pytest.mark.parametrize("dispatchers", [2, 4])
def test_dispatchers_racing_fire_each_time_out_once(geneva_session, fired, dispatchers):
    parked = [_parked_past_deadline(geneva_session)[1] for _ in range(12)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(dispatchers)

    def dispatcher() -> None:
        try:
            barrier.wait(10)
            for _ in range(3):
                dispatch_due(utcnow(), batch_size=5)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=dispatcher) for _ in range(dispatchers)]
    for thread in threads:
        thread.start()
    _join(threads, errors)
    dispatch_due(utcnow())
    assert sorted(fired) == sorted(parked)  # every one fired, none twice
    geneva_session.expire_all()
    for execution_id in parked:
        execution = geneva_session.get(StepExecution, execution_id)
        assert execution.timed_out_at is not None and execution.state == "scheduled"
    assert_invariants(geneva_session)
