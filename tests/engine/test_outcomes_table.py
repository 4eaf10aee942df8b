"""The outcome table (engine/outcomes.py) against the state machine (engine/states.py): every
row is a move the machine allows, and the lookups keep the gem's special cases."""

from __future__ import annotations

import pytest

from geneva_drive.flow_control import FlowAction
from geneva_drive.outcomes import OUTCOMES, Action, Cause, Follow, decide, prepare_failed
from geneva_drive.policies import ACTIONS, PolicyResult
from geneva_drive.states import (
    STEP_STATE_OUTCOMES,
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    Outcome,
    StepState,
    WorkflowState,
)


def _rows():
    for key, decision in OUTCOMES.items():
        yield key, decision
        if decision.when_resumable is not None:
            yield (*key, "resumable"), decision.when_resumable


@pytest.mark.parametrize(("key", "decision"), list(_rows()), ids=lambda v: str(v))
def test_every_row_is_a_legal_move(key, decision):
    # A body ends in progress; a precondition's exception ends a scheduled execution.
    for start in (StepState.IN_PROGRESS, StepState.SCHEDULED):
        assert decision.step_state in STEP_TRANSITIONS[start]
    outcomes = [decision.outcome] if decision.outcome else [Outcome.SUCCESS, Outcome.TIMED_OUT]
    for outcome in outcomes:
        assert outcome in STEP_STATE_OUTCOMES[decision.step_state]
    assert decision.workflow_state in WORKFLOW_TRANSITIONS[WorkflowState.PERFORMING]
    if decision.follow == Follow.NOTHING:
        assert decision.workflow_state != WorkflowState.READY
    else:
        assert decision.workflow_state == WorkflowState.READY
    # An error is written only where the step failed.
    assert decision.records_error == (decision.step_state == StepState.FAILED)


def test_every_step_action_and_policy_action_has_a_row():
    for action in [*Action, *FlowAction]:
        assert (Cause.STEP, action) in OUTCOMES
    for action in [*ACTIONS, FlowAction.FINISHED]:
        assert (Cause.ERROR, action) in OUTCOMES


def test_an_unknown_policy_action_pauses_and_an_unknown_step_action_is_a_bug():
    """The gem's "anything else" row: an imperative handler's suspend() fails and pauses."""
    assert decide(Cause.ERROR, "suspend") == decide(Cause.ERROR, "pause")
    assert decide(Cause.ERROR, "pause").workflow_state == WorkflowState.PAUSED
    with pytest.raises(KeyError):
        decide(Cause.STEP, "no such action")


def test_a_resumable_step_keeps_its_cursor_on_pause():
    plain = decide(Cause.STEP, FlowAction.PAUSE)
    resumable = decide(Cause.STEP, FlowAction.PAUSE, resumable=True)
    assert (plain.step_state, plain.outcome) == (StepState.CANCELED, Outcome.CANCELED)
    assert (resumable.step_state, resumable.outcome) == (
        StepState.COMPLETED,
        Outcome.WORKFLOW_PAUSED,
    )
    assert decide(Cause.STEP, FlowAction.SKIP, resumable=True) == decide(
        Cause.STEP, FlowAction.SKIP
    )


def test_a_policy_result_carries_its_decision():
    error = ValueError("x")
    assert PolicyResult("cancel", error).decision == decide(Cause.ERROR, "cancel")
    assert PolicyResult("cancel", error).decision != decide(Cause.STEP, "cancel")


@pytest.mark.parametrize(
    ("action", "workflow_state", "follow"),
    [
        ("reattempt", WorkflowState.READY, Follow.SAME_STEP),
        ("cancel", WorkflowState.CANCELED, Follow.NOTHING),
        ("skip", WorkflowState.READY, Follow.NEXT_STEP),
        ("pause", WorkflowState.PAUSED, Follow.NOTHING),
        ("finished", WorkflowState.PAUSED, Follow.NOTHING),
    ],
)
def test_before_the_body_the_step_fails_and_the_policy_moves_the_workflow(
    action, workflow_state, follow
):
    decision = prepare_failed(decide(Cause.ERROR, action))
    assert (decision.step_state, decision.outcome) == (StepState.FAILED, Outcome.FAILED)
    assert (decision.workflow_state, decision.follow) == (workflow_state, follow)
    assert decision.records_error and not decision.resolves_signal
