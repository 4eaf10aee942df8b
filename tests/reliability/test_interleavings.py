"""Operator actions landing while a step body runs, forced in each order (SQLite and PostgreSQL).

The body blocks on an event, so the interleaving is exact: the worker thread is inside the
body (no lock held, no transaction open) while the operator acts in its own transaction.
"""

from __future__ import annotations

import pytest

from geneva_drive import IterableStep, Workflow, inline, resumable_step, step
from geneva_drive.errors import InvalidStateError
from geneva_drive.instrumentation import inline_successor
from tests.reliability.harness import (
    BodyGate,
    Ledger,
    act,
    drain,
    new_workflow,
    workflow_state,
)
from tests.reliability.invariants import assert_invariants

# The wall-time budget is not what these tests are about (tests/conftest.py says why).
pytestmark = pytest.mark.usefixtures("generous_inline_time_budget")


LEDGER = Ledger()
GATE = BodyGate()


class HeldStepWorkflow(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")
        GATE.hold()

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
            if item == 1:
                GATE.hold()

        it.iterate_over(range(4), visit)

    @step
    def done(self):
        LEDGER.record(self.id, "done")


@pytest.fixture(autouse=True)
def _reset():
    LEDGER.clear()
    GATE.reset()
    yield
    GATE.released.set()


def run_with_held_body(workflow_id: int, *operator_actions: tuple) -> list:
    """The operator acts while the current step's body is held; a refused action gives its
    exception in the returned list."""
    return GATE.run_held(workflow_id, *operator_actions, keep_errors=True)


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


# --- an operator action landing between two inline steps ---------------------------------------


class InlineChainWorkflow(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")

    @step
    def two(self):
        LEDGER.record(self.id, "two")

    @step
    def three(self):
        LEDGER.record(self.id, "three")


def run_with_held_hand_off(workflow_id: int, *operator_actions: tuple) -> list:
    """Run the workflow's current execution as a worker with inline successors does, holding
    the worker between ``one``'s commit and the claim of ``two`` while the operator acts."""
    hand_offs: list[dict] = []

    def held(_sender, **payload):
        hand_offs.append(payload)
        if len(hand_offs) == 1:
            GATE.hold()

    def one_committed_two_unclaimed() -> None:
        # one's outcome is committed; two is scheduled, unsent, not yet claimed.
        assert workflow_state(workflow_id) == "ready"
        assert LEDGER.count(workflow_id, "one") == 1
        assert LEDGER.count(workflow_id, "two") == 0

    inline_successor.connect(held)
    try:
        outcomes = GATE.run_held(
            workflow_id,
            *operator_actions,
            budget=inline.Budget(),
            while_held=one_committed_two_unclaimed,
            keep_errors=True,
        )
    finally:
        inline_successor.disconnect(held)
    assert hand_offs[0]["workflow_id"] == workflow_id
    return outcomes


def test_pause_between_two_inline_steps_stops_the_chain_and_resume_continues(rdb):
    workflow_id = new_workflow(InlineChainWorkflow)
    run_with_held_hand_off(workflow_id, ("pause",))
    # The claim saw the pause under the workflow lock: two did not run, as when its message
    # is delivered to a paused workflow.
    assert workflow_state(workflow_id) == "paused"
    assert LEDGER.count(workflow_id, "two") == 0
    assert_invariants(rdb, quiescent=True)
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    for name in ("one", "two", "three"):
        assert LEDGER.count(workflow_id, name) == 1, (name, LEDGER.runs)
    assert_invariants(rdb, quiescent=True)


def test_pause_and_resume_between_two_inline_steps_keep_the_chain_going(rdb):
    workflow_id = new_workflow(InlineChainWorkflow)
    outcomes = run_with_held_hand_off(workflow_id, ("pause",), ("resume",))
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    # Ready again when the worker claimed two: it ran two and three itself.
    assert workflow_state(workflow_id) == "finished"
    assert drain() == 0
    for name in ("one", "two", "three"):
        assert LEDGER.count(workflow_id, name) == 1, (name, LEDGER.runs)
    assert_invariants(rdb, quiescent=True)


def test_cancel_between_two_inline_steps(rdb):
    workflow_id = new_workflow(InlineChainWorkflow)
    run_with_held_hand_off(workflow_id, ("cancel",))
    assert workflow_state(workflow_id) == "canceled"
    drain()
    assert LEDGER.count(workflow_id, "two") == 0
    assert LEDGER.count(workflow_id, "three") == 0
    assert_invariants(rdb, quiescent=True)
