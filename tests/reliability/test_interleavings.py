"""Operator actions landing while a step body runs, forced in each order (SQLite and PostgreSQL).

The body blocks on an event, so the interleaving is exact: the worker thread is inside the
body (no lock held, no transaction open) while the operator acts in its own transaction.
"""

from __future__ import annotations

import threading

import pytest

from geneva_drive import IterableStep, Workflow, executor, resumable_step, step
from geneva_drive.errors import InvalidStateError
from tests.reliability.harness import (
    Ledger,
    act,
    current_execution_id,
    drain,
    new_workflow,
    workflow_state,
)
from tests.reliability.invariants import assert_invariants

LEDGER = Ledger()
ENTERED = threading.Event()
RELEASE = threading.Event()


def _block() -> None:
    ENTERED.set()
    assert RELEASE.wait(20), "test never released the step body"


class HeldStepWorkflow(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")
        if not RELEASE.is_set():
            _block()

    @step
    def two(self):
        LEDGER.record(self.id, "two")

    @step
    def three(self):
        LEDGER.record(self.id, "three")


class HeldResumableWorkflow(Workflow):
    @resumable_step
    def walk(self, it: IterableStep):
        def visit(item):
            LEDGER.record(self.id, f"item{item}")
            if item == 1 and not RELEASE.is_set():
                _block()

        it.iterate_over(range(4), visit)

    @step
    def done(self):
        LEDGER.record(self.id, "done")


@pytest.fixture(autouse=True)
def _reset():
    LEDGER.clear()
    ENTERED.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def run_with_held_body(workflow_id: int, *operator_actions: tuple) -> list:
    """Start the current execution in a worker thread, apply the operator actions while its
    body is held, then release it. Returns what each action returned (or raised)."""
    execution_id = current_execution_id(workflow_id)
    errors: list[BaseException] = []

    def worker():
        try:
            executor.execute(execution_id)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert ENTERED.wait(20), "the step body never started"
    outcomes = []
    for action in operator_actions:
        try:
            outcomes.append(act(workflow_id, *action))
        except Exception as error:
            outcomes.append(error)
    RELEASE.set()
    thread.join(20)
    assert not thread.is_alive()
    assert errors == [], errors
    return outcomes


def test_pause_while_step_runs_discards_the_result_and_resume_reruns_it(rdb):
    workflow_id = new_workflow(HeldStepWorkflow)
    run_with_held_body(workflow_id, ("pause",))
    assert workflow_state(workflow_id) == "paused"
    assert_invariants(rdb, quiescent=True)
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 2  # documented: a paused step runs again
    assert LEDGER.count(workflow_id, "two") == 1
    assert_invariants(rdb, quiescent=True)


def test_pause_then_resume_while_step_runs_keeps_the_workflow_moving(rdb):
    workflow_id = new_workflow(HeldStepWorkflow)
    outcomes = run_with_held_body(workflow_id, ("pause",), ("resume",))
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    assert_invariants(rdb)
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "two") == 1
    assert LEDGER.count(workflow_id, "three") == 1
    assert_invariants(rdb, quiescent=True)


@pytest.mark.parametrize("action", [("resume_at", "three"), ("skip",), ("reattempt",)])
def test_operator_moves_a_paused_workflow_whose_step_still_runs(rdb, action):
    workflow_id = new_workflow(HeldStepWorkflow)
    outcomes = run_with_held_body(workflow_id, ("pause",), action)
    # Either a clear refusal or a clean move; never a database error.
    assert all(o is None or isinstance(o, int | InvalidStateError) for o in outcomes), outcomes
    assert_invariants(rdb)
    if workflow_state(workflow_id) == "paused":
        act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "three") == 1
    assert_invariants(rdb, quiescent=True)


def test_cancel_while_step_runs(rdb):
    workflow_id = new_workflow(HeldStepWorkflow)
    run_with_held_body(workflow_id, ("cancel",))
    assert workflow_state(workflow_id) == "canceled"
    drain()
    assert LEDGER.count(workflow_id, "two") == 0
    assert_invariants(rdb, quiescent=True)


def test_pause_cancel_while_step_runs(rdb):
    workflow_id = new_workflow(HeldStepWorkflow)
    run_with_held_body(workflow_id, ("pause",), ("cancel",))
    assert workflow_state(workflow_id) == "canceled"
    assert_invariants(rdb, quiescent=True)


def test_resumable_step_paused_mid_walk_continues_from_its_cursor(rdb):
    workflow_id = new_workflow(HeldResumableWorkflow)
    run_with_held_body(workflow_id, ("pause",))
    assert workflow_state(workflow_id) == "paused"
    assert_invariants(rdb, quiescent=True)
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    for item in range(4):
        assert LEDGER.count(workflow_id, f"item{item}") == 1, (item, LEDGER.runs)
    assert_invariants(rdb, quiescent=True)


def test_resumable_step_paused_and_resumed_mid_walk(rdb):
    workflow_id = new_workflow(HeldResumableWorkflow)
    run_with_held_body(workflow_id, ("pause",), ("resume",))
    assert_invariants(rdb)
    drain()
    assert workflow_state(workflow_id) == "finished"
    for item in range(4):
        assert LEDGER.count(workflow_id, f"item{item}") == 1, (item, LEDGER.runs)
    assert LEDGER.count(workflow_id, "done") == 1
    assert_invariants(rdb, quiescent=True)
