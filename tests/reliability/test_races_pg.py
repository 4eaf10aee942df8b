"""Races on PostgreSQL and MariaDB: many threads (and processes), each with its own
session/connection.

Each scenario is repeated several times with the participants released together by a barrier,
and the invariant checker runs after each. Skipped unless GENEVA_TEST_DATABASE_URL points at
PostgreSQL or MariaDB/MySQL (SQLite variants live in test_races_sqlite.py).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from geneva_drive import Workflow, db, executor, step
from geneva_drive.dispatch import dispatch_due
from geneva_drive.errors import DuplicateWorkflowError, InvalidStateError, WorkflowNotOngoing
from geneva_drive.models import Signal, StepExecution, utcnow
from tests.conftest import Order
from tests.reliability.harness import (
    FileLedger,
    Ledger,
    act,
    current_execution_id,
    drain,
    new_order_id,
    new_workflow,
    requires_postgres,
    session_scope,
    storm,
    workflow_state,
)
from tests.reliability.invariants import assert_invariants

pytestmark = requires_postgres

LEDGER = Ledger()
FILE_LEDGER: FileLedger | None = None


class RacePgOnce(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")
        if FILE_LEDGER is not None:
            FILE_LEDGER.record(self.id, "one")
        time.sleep(random.uniform(0, 0.003))

    @step
    def two(self):
        LEDGER.record(self.id, "two")
        if FILE_LEDGER is not None:
            FILE_LEDGER.record(self.id, "two")


class RacePgGate(Workflow):
    @step(wait_for="go")
    def gated(self):
        LEDGER.record(self.id, "gated")

    @step
    def after(self):
        LEDGER.record(self.id, "after")


class RacePgPaused(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")
        self.pause()

    @step
    def two(self):
        LEDGER.record(self.id, "two")

    @step
    def three(self):
        LEDGER.record(self.id, "three")


class RacePgLater(Workflow):
    @step(wait=timedelta(hours=1))
    def later(self):
        LEDGER.record(self.id, "later")


@pytest.fixture(autouse=True)
def _clean_ledger():
    LEDGER.clear()
    yield
    LEDGER.clear()


def _execute(execution_id):
    return lambda: executor.execute(execution_id)


@pytest.mark.parametrize("workers", [2, 8])
def test_same_execution_delivered_to_many_threads_runs_once(rdb, workers):
    for _ in range(15):
        workflow_id = new_workflow(RacePgOnce)
        execution_id = current_execution_id(workflow_id)
        result = storm([_execute(execution_id)] * workers)
        assert result.unexpected() == []
        assert LEDGER.count(workflow_id, "one") == 1
        assert_invariants(rdb)
        second = current_execution_id(workflow_id)
        assert second is not None and second != execution_id
        storm([_execute(second)] * workers)
        assert LEDGER.count(workflow_id, "two") == 1
        assert workflow_state(workflow_id) == "finished"
    assert_invariants(rdb, quiescent=True)


def _worker_process(ids, ledger_path, barrier):
    # A forked worker: its own connections (the parent's pool must not be shared).
    global FILE_LEDGER
    db.get_engine().dispose(close=False)
    FILE_LEDGER = FileLedger(ledger_path)
    barrier.wait(30)
    for execution_id in ids:
        executor.execute(execution_id)
    os._exit(0)


def test_same_executions_delivered_to_several_processes_run_once(rdb, tmp_path):
    ledger_path = tmp_path / "runs.txt"
    ids, workflow_ids = [], []
    for _ in range(40):
        workflow_id = new_workflow(RacePgOnce)
        workflow_ids.append(workflow_id)
        ids.append(current_execution_id(workflow_id))
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    processes = []
    for n in range(4):
        order = list(ids) if n % 2 == 0 else list(reversed(ids))
        process = context.Process(target=_worker_process, args=(order, ledger_path, barrier))
        process.start()
        processes.append(process)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0, f"worker process exited with {process.exitcode}"
    runs = FileLedger(ledger_path).runs()
    assert {wf for wf, _ in runs} == set(workflow_ids)
    assert all(count == 1 for count in runs.values()), runs
    assert_invariants(rdb)


def test_concurrent_create_for_one_hero_has_one_winner(rdb):
    for _ in range(10):
        order_id = new_order_id()

        def create(order_id=order_id):
            with session_scope() as session:
                hero = session.get(Order, order_id)
                return RacePgOnce.create(hero=hero, session=session).id

        result = storm([create] * 8)
        assert result.unexpected(DuplicateWorkflowError) == []
        assert len(result.results) == 1
        assert len(result.errors_of(DuplicateWorkflowError)) == 7
        with session_scope() as session:
            count = session.scalar(
                select(func.count()).select_from(Workflow).where(Workflow.hero_id == str(order_id))
            )
        assert count == 1
    assert_invariants(rdb)


@pytest.mark.parametrize("dispatchers", [2, 4])
def test_dispatchers_send_each_due_execution_once_per_round(rdb, geneva_transport, dispatchers):
    ids = set()
    for _ in range(60):
        ids.add(current_execution_id(new_workflow(RacePgLater)))
    geneva_transport.clear()
    moment = utcnow() + timedelta(hours=2)
    result = storm([lambda: dispatch_due(moment, batch_size=7)] * dispatchers)
    assert result.unexpected() == []
    sent = Counter(geneva_transport.execution_ids)
    assert set(sent) == ids
    assert max(sent.values()) == 1, sent
    assert sum(result.results) == len(ids)
    # The same round again sends nothing: every row was stamped sent.
    geneva_transport.clear()
    again = storm([lambda: dispatch_due(moment, batch_size=7)] * dispatchers)
    assert sum(again.results) == 0 and geneva_transport.messages == []
    assert_invariants(rdb)


def test_pause_racing_the_running_step(rdb):
    """pause() lands before, during or after the step: nothing is lost, nothing runs twice in
    one execution, and resume() brings every workflow to the end."""
    workflow_ids = []
    for _ in range(30):
        workflow_id = new_workflow(RacePgOnce)
        workflow_ids.append(workflow_id)
        execution_id = current_execution_id(workflow_id)

        def pause(workflow_id=workflow_id):
            time.sleep(random.uniform(0, 0.004))
            act(workflow_id, "pause")

        result = storm([_execute(execution_id), pause])
        assert result.unexpected(InvalidStateError) == []
        assert_invariants(rdb)
        assert workflow_state(workflow_id) == "paused"
    for workflow_id in workflow_ids:
        act(workflow_id, "resume")
    drain()
    for workflow_id in workflow_ids:
        assert workflow_state(workflow_id) == "finished"
        assert LEDGER.count(workflow_id, "two") == 1
        assert 1 <= LEDGER.count(workflow_id, "one") <= 2
    assert_invariants(rdb, quiescent=True)


def test_pause_and_resume_racing_the_running_step(rdb):
    """An operator pauses and resumes while the step runs: the workflow must still finish."""
    workflow_ids = []
    for _ in range(30):
        workflow_id = new_workflow(RacePgOnce)
        workflow_ids.append(workflow_id)
        execution_id = current_execution_id(workflow_id)

        def pause_resume(workflow_id=workflow_id):
            time.sleep(random.uniform(0, 0.004))
            act(workflow_id, "pause")
            act(workflow_id, "resume")

        result = storm([_execute(execution_id), pause_resume])
        assert result.unexpected(InvalidStateError) == []
        assert_invariants(rdb)
    drain()
    for workflow_id in workflow_ids:
        assert workflow_state(workflow_id) == "finished", workflow_id
    assert_invariants(rdb, quiescent=True)


def test_cancel_racing_a_signal(rdb):
    for _ in range(30):
        workflow_id = new_workflow(RacePgGate)
        drain()  # parks at the gate
        assert workflow_state(workflow_id) == "ready"

        def cancel(workflow_id=workflow_id):
            act(workflow_id, "cancel")

        def signal(workflow_id=workflow_id):
            with session_scope() as session:
                session.get(Workflow, workflow_id).signal("go", {"n": 1}, idempotency_key="k")

        result = storm([cancel, signal, signal])
        assert result.unexpected(WorkflowNotOngoing) == []
        assert workflow_state(workflow_id) == "canceled"
        assert_invariants(rdb)
        drain()
        assert LEDGER.count(workflow_id, "gated") == 0
        with session_scope() as session:
            signals = session.scalar(
                select(func.count()).select_from(Signal).where(Signal.workflow_id == workflow_id)
            )
        assert signals <= 1
    assert_invariants(rdb, quiescent=True)


def test_signal_storm_wakes_the_gate_once(rdb):
    for _ in range(10):
        workflow_id = new_workflow(RacePgGate)
        drain()

        def signal(key, workflow_id=workflow_id):
            with session_scope() as session:
                session.get(Workflow, workflow_id).signal("go", {"k": key}, idempotency_key=key)

        storm_result = storm([lambda k=k: signal(k % 3) for k in range(9)])
        assert storm_result.unexpected() == []
        assert_invariants(rdb)
        with session_scope() as session:
            rows = list(session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)))
            assert len(rows) == 3  # one per idempotency key
            assert sum(r.claimed for r in rows) == 1  # one wake, one claim
        drain()
        assert LEDGER.count(workflow_id, "gated") == 1
        assert workflow_state(workflow_id) == "finished"
    assert_invariants(rdb, quiescent=True)


def test_two_resume_at_have_one_winner(rdb):
    for _ in range(15):
        workflow_id = new_workflow(RacePgPaused)
        drain()
        assert workflow_state(workflow_id) == "paused"
        result = storm(
            [
                lambda w=workflow_id: act(w, "resume_at", "two"),
                lambda w=workflow_id: act(w, "resume_at", "three"),
            ]
        )
        assert result.unexpected(InvalidStateError) == []
        assert len(result.results) == 1 and len(result.errors) == 1
        assert_invariants(rdb)
        drain()
        assert workflow_state(workflow_id) == "finished"
    assert_invariants(rdb, quiescent=True)


def test_resume_skip_cancel_storm(rdb):
    """Every operator action at once on a paused workflow: whatever wins, invariants hold."""
    for _ in range(20):
        workflow_id = new_workflow(RacePgPaused)
        drain()
        actions = ["resume", "skip", "cancel", "reattempt", "pause"]
        random.shuffle(actions)
        fns = [lambda a=a, w=workflow_id: act(w, a) for a in actions]
        fns.append(lambda w=workflow_id: act(w, "resume_at", "three"))
        result = storm(fns)
        assert result.unexpected(InvalidStateError) == []
        assert_invariants(rdb)
        drain()
        assert workflow_state(workflow_id) in ("finished", "canceled", "paused")
    assert_invariants(rdb)


def test_execute_racing_housekeeping_recovery(rdb):
    """A stuck-scheduled sweep and a worker reaching the same execution: it runs once."""
    from geneva_drive import housekeeping
    from geneva_drive.config import settings

    settings.stuck_scheduled_threshold = timedelta(0)
    for _ in range(15):
        workflow_id = new_workflow(RacePgOnce)
        execution_id = current_execution_id(workflow_id)
        moment = utcnow() + timedelta(seconds=1)
        result = storm(
            [_execute(execution_id), lambda m=moment: housekeeping.recover_stuck("scheduled", m)]
        )
        assert result.unexpected() == []
        assert_invariants(rdb)
        drain()
        assert workflow_state(workflow_id) == "finished"
        # Recovery re-checks under the lock: a started step is never recovered and rerun.
        assert LEDGER.count(workflow_id, "one") == 1
        assert LEDGER.count(workflow_id, "two") == 1
    with session_scope() as session:
        assert (
            session.scalar(
                select(func.count())
                .select_from(StepExecution)
                .where(StepExecution.state == "in_progress")
            )
            == 0
        )
    assert_invariants(rdb, quiescent=True)


def test_cleanup_racing_signals_and_operators_on_finished_workflows(rdb):
    """Housekeeping deletes old finished workflows while webhooks retry keyed signals and
    operators click on them: each caller gets a clear answer, nothing is orphaned."""
    from geneva_drive import housekeeping
    from geneva_drive.config import settings

    settings.delete_completed_workflows_after = 0
    settings.housekeeping_batch_size = 3

    def retry_signal(workflow_id):
        with session_scope() as session:
            workflow = session.get(Workflow, workflow_id)
            if workflow is None:
                return "gone"
            return workflow.signal("go", {"n": 2}, idempotency_key="k").duplicate_delivery

    def operator(workflow_id):
        with session_scope() as session:
            workflow = session.get(Workflow, workflow_id)
            if workflow is None:
                return "gone"
            workflow.cancel()

    for _ in range(3):
        ids = []
        for _ in range(12):
            workflow_id = new_workflow(RacePgGate)
            drain()
            with session_scope() as session:
                session.get(Workflow, workflow_id).signal("go", {"n": 1}, idempotency_key="k")
            drain()
            assert workflow_state(workflow_id) == "finished"
            ids.append(workflow_id)
        fns = [lambda: housekeeping.run(utcnow() + timedelta(seconds=1))]
        for workflow_id in ids:
            fns.append(lambda w=workflow_id: retry_signal(w))
            fns.append(lambda w=workflow_id: operator(w))
        result = storm(fns)
        assert result.unexpected(InvalidStateError, WorkflowNotOngoing) == []
        assert all(r in (True, "gone", None) or hasattr(r, "as_dict") for r in result.results)
        assert_invariants(rdb)
        with session_scope() as session:
            assert session.scalar(select(func.count()).select_from(Workflow)) == 0
            assert session.scalar(select(func.count()).select_from(Signal)) == 0
            assert session.scalar(select(func.count()).select_from(StepExecution)) == 0
