"""Operator actions on paused workflows whose preserved execution is still live (found by the
soak): whatever the action, no live execution may outlive the workflow's end."""

from __future__ import annotations

import pytest

from geneva_drive import Workflow, step
from tests.reliability.harness import (
    Ledger,
    act,
    current_execution_id,
    drain,
    new_workflow,
    session_scope,
    workflow_state,
)
from tests.reliability.invariants import assert_invariants

LEDGER = Ledger()


class EdgeTwoSteps(Workflow):
    @step
    def first(self):
        LEDGER.record(self.id, "first")

    @step
    def last(self):
        LEDGER.record(self.id, "last")


class EdgeGatedLast(Workflow):
    @step
    def first(self):
        LEDGER.record(self.id, "first")

    @step(wait_for="go")
    def last(self):
        LEDGER.record(self.id, "last")


def _run_first_then_pause(cls) -> int:
    workflow_id = new_workflow(cls)
    from geneva_drive import executor

    executor.execute(current_execution_id(workflow_id))  # first runs; last is now current
    if cls is EdgeGatedLast:
        executor.execute(current_execution_id(workflow_id))  # parks at the gate
    act(workflow_id, "pause")
    return workflow_id


@pytest.mark.parametrize("cls", [EdgeTwoSteps, EdgeGatedLast])
def test_skipping_the_preserved_last_step_of_a_paused_workflow(rdb, cls):
    LEDGER.clear()
    workflow_id = _run_first_then_pause(cls)
    act(workflow_id, "skip")
    assert workflow_state(workflow_id) == "finished"
    drain()
    assert LEDGER.count(workflow_id, "last") == 0
    with session_scope() as session:
        states = [
            (e.step_name, e.state, e.outcome)
            for e in session.get(Workflow, workflow_id).execution_history
        ]
    # As with a next step to go to: the preserved execution is swept (the gem's rule).
    assert states[-1] == ("last", "canceled", "canceled"), states
    assert_invariants(rdb, quiescent=True)


@pytest.mark.parametrize("cls", [EdgeTwoSteps, EdgeGatedLast])
@pytest.mark.parametrize("action", [("cancel",), ("resume_at", "first"), ("resume",)])
def test_other_actions_on_a_paused_workflow_with_a_preserved_execution(rdb, cls, action):
    LEDGER.clear()
    workflow_id = _run_first_then_pause(cls)
    act(workflow_id, *action)
    assert_invariants(rdb)
    if cls is EdgeGatedLast and workflow_state(workflow_id) == "ready":
        with session_scope() as session:
            session.get(Workflow, workflow_id).signal("go")
    drain()
    if cls is EdgeGatedLast and workflow_state(workflow_id) == "ready":
        with session_scope() as session:
            session.get(Workflow, workflow_id).signal("go")
        drain()
    assert workflow_state(workflow_id) in ("finished", "canceled")
    assert_invariants(rdb, quiescent=True)
