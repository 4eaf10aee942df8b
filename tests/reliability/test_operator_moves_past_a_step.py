"""An operator moves a workflow past the step that is running: four cases, items 1-4 below.

Thread-driven like test_interleavings.py: the body blocks on an event, so the operator acts
exactly while it runs, in its own transaction; then the body is released and the worker's
finalize sees what the operator did. Runs on SQLite and PostgreSQL (GENEVA_TEST_DATABASE_URL).
"""

from __future__ import annotations

from datetime import datetime

import pytest

from geneva_drive import IterableStep, Workflow, executor, removed_step, resumable_step, step
from geneva_drive.models import StepExecution, utcnow
from tests.reliability.harness import (
    BodyGate,
    Ledger,
    act,
    current_execution_id,
    drain,
    new_workflow,
    session_scope,
    step_history,
    workflow_state,
)
from tests.reliability.invariants import assert_body_runs_in_progress, assert_invariants

LEDGER = Ledger()
GATE = BodyGate()
#: (execution id, when) of every resumable item that ran: no body may run for a closed execution.
BODY_RUNS: list[tuple[int, datetime]] = []
RAISED_ONCE: list[bool] = []


class SkipIntoSkippedStep(Workflow):
    @step
    def a(self):
        LEDGER.record(self.id, "a")
        GATE.hold()

    @step(skip_if=True)
    def b(self):
        LEDGER.record(self.id, "b")

    @step
    def c(self):
        LEDGER.record(self.id, "c")


class SkipIntoFlakyCondition(Workflow):
    @step
    def a(self):
        LEDGER.record(self.id, "a")
        GATE.hold()

    @step(skip_if="flaky_condition", on_exception="reattempt")
    def b(self):
        LEDGER.record(self.id, "b")

    @step
    def c(self):
        LEDGER.record(self.id, "c")

    def flaky_condition(self) -> bool:
        if not RAISED_ONCE:
            RAISED_ONCE.append(True)
            raise RuntimeError("condition backend unavailable")
        return False


class HeldWalk(Workflow):
    @resumable_step
    def walk(self, it: IterableStep):
        def visit(item):
            BODY_RUNS.append((it.execution.id, utcnow()))
            LEDGER.record(self.id, f"item{item}")
            if item == 1:
                GATE.hold()

        it.iterate_over(range(5), visit)

    @step
    def done(self):
        LEDGER.record(self.id, "done")


@pytest.fixture(autouse=True)
def _reset():
    LEDGER.clear()
    GATE.reset()
    BODY_RUNS.clear()
    RAISED_ONCE.clear()
    yield
    GATE.released.set()


def run_with_held_body(workflow_id: int, *operator_actions: tuple) -> list:
    """The operator acts while the current step's body is held; every action must succeed."""
    return GATE.run_held(workflow_id, *operator_actions)


# --- item 1: skip after a pause mid-step counts from the step the operator skipped ------------


def test_skip_after_pause_mid_step_then_a_skip_if_step_does_not_loop(rdb):
    workflow_id = new_workflow(SkipIntoSkippedStep)
    run_with_held_body(workflow_id, ("pause",), ("skip",))
    assert_invariants(rdb, quiescent=True)
    drain(max_rounds=20)
    assert workflow_state(workflow_id) == "finished"
    assert step_history(workflow_id) == [
        ("a", "skipped", "skipped"),
        ("b", "skipped", "skipped"),
        ("c", "completed", "success"),
    ]
    assert LEDGER.count(workflow_id, "c") == 1
    assert_invariants(rdb, quiescent=True)


def test_skip_after_pause_mid_step_then_a_reattempted_condition_retries_the_next_step(rdb):
    workflow_id = new_workflow(SkipIntoFlakyCondition)
    run_with_held_body(workflow_id, ("pause",), ("skip",))
    drain(max_rounds=20)
    assert workflow_state(workflow_id) == "finished"
    # The reattempt after b's condition raised retries b, not a (which the operator skipped).
    assert step_history(workflow_id) == [
        ("a", "skipped", "skipped"),
        ("b", "completed", "reattempted"),
        ("b", "completed", "success"),
        ("c", "completed", "success"),
    ]
    assert LEDGER.count(workflow_id, "a") == 1
    assert_invariants(rdb, quiescent=True)


# --- item 2: a resumable body stops at its next checkpoint once the operator moved past it ----


@pytest.mark.parametrize("move", [("skip",), ("resume_at", "done"), ("cancel",)])
def test_resumable_body_stops_once_the_operator_moved_past_it(rdb, move):
    workflow_id = new_workflow(HeldWalk)
    run_with_held_body(workflow_id, ("pause",), move)
    # Item 1 was running when the operator acted; the checkpoint after it stops the body.
    assert [LEDGER.count(workflow_id, f"item{i}") for i in range(5)] == [1, 1, 0, 0, 0]
    assert_body_runs_in_progress(rdb, BODY_RUNS)
    assert_invariants(rdb, quiescent=True)
    drain()
    expected = "canceled" if move == ("cancel",) else "finished"
    assert workflow_state(workflow_id) == expected
    assert LEDGER.count(workflow_id, "done") == (0 if move == ("cancel",) else 1)
    assert_invariants(rdb, quiescent=True)


def test_resumable_body_paused_and_resumed_keeps_walking(rdb):
    workflow_id = new_workflow(HeldWalk)
    run_with_held_body(workflow_id, ("pause",), ("resume",))
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert [LEDGER.count(workflow_id, f"item{i}") for i in range(5)] == [1, 1, 1, 1, 1]
    assert_body_runs_in_progress(rdb, BODY_RUNS)
    assert_invariants(rdb, quiescent=True)


# --- item 3: a subclass's in-flight gravestone executions count for the parent ----------------


def test_removed_steps_in_flight_counts_subclasses(rdb):
    class DrainParent(Workflow):
        @step
        def first(self):
            pass

        @step
        def gone(self):
            pass

        @step
        def last(self):
            pass

    class DrainChild(DrainParent):
        pass

    workflow_id = new_workflow(DrainChild)
    drain_one = current_execution_id(workflow_id)
    executor.execute(drain_one)  # 'gone' is now scheduled for the child's workflow

    class DrainParentV2(Workflow):
        workflow_name = DrainParent.workflow_name

        @step
        def first(self):
            pass

        gone = removed_step()

        @step
        def last(self):
            pass

    class DrainChildV2(DrainParentV2):
        workflow_name = DrainChild.workflow_name

    with session_scope() as session:
        assert DrainChildV2.removed_steps_in_flight(session) == {"gone": 1}
        # {} would mean "drained, delete the gravestone", stranding the child's workflow.
        assert DrainParentV2.removed_steps_in_flight(session) == {"gone": 1}


# --- item 4: an operator's skip or cancel closes the execution with finished_at ----------------


@pytest.mark.parametrize("action", ["skip", "cancel"])
def test_operator_skip_and_cancel_write_finished_at(rdb, action):
    workflow_id = new_workflow(SkipIntoSkippedStep)
    execution_id = current_execution_id(workflow_id)
    act(workflow_id, action)
    with session_scope() as session:
        closed = session.get(StepExecution, execution_id)
        assert closed is not None and closed.state in ("skipped", "canceled")
        assert closed.finished_at is not None
    assert_invariants(rdb)


@pytest.mark.parametrize("move", [("skip",), ("cancel",), ("resume_at", "c")])
def test_operator_closing_a_running_execution_writes_finished_at(rdb, move):
    workflow_id = new_workflow(SkipIntoSkippedStep)
    execution_id = current_execution_id(workflow_id)
    run_with_held_body(workflow_id, ("pause",), move)
    with session_scope() as session:
        closed = session.get(StepExecution, execution_id)
        assert closed is not None and closed.state in ("skipped", "canceled")
        assert closed.finished_at is not None
        assert closed.duration_seconds is not None
    assert_invariants(rdb, quiescent=True)
