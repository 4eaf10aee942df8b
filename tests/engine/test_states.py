"""The state machines (docs/MANUAL.md, "Core concepts" and "States": workflow and step execution
states, transitions, timestamps, outcomes, ongoing-ness and the step pointers)."""

from __future__ import annotations

import itertools

import pytest

from geneva_drive import Workflow, step
from geneva_drive.errors import InvalidTransitionError
from geneva_drive.models import OUTCOMES, StepExecution, utcnow
from geneva_drive.states import (
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    StepState,
    WorkflowState,
    check_step_transition,
    check_workflow_transition,
    is_ongoing,
)
from geneva_drive.testing import perform_next_step, speedrun_workflow
from geneva_drive.transitions import transition_step, transition_workflow
from tests.engine.helpers import assert_recent, make_order

WORKFLOW_STATES = ["ready", "performing", "paused", "finished", "canceled"]
STEP_STATES = ["scheduled", "waiting", "in_progress", "completed", "failed", "canceled", "skipped"]


def test_state_and_outcome_vocabularies_match_the_gem():
    assert [s.value for s in WorkflowState] == WORKFLOW_STATES
    assert sorted(s.value for s in StepState) == sorted(STEP_STATES)
    assert "suspended" not in {s.value for s in StepState}
    assert {
        "success",
        "continued",
        "reattempted",
        "skipped",
        "canceled",
        "failed",
        "recovered",
        "workflow_paused",
        "timed_out",  # beyond the gem: time-bounded waits
    } == set(OUTCOMES)


def test_ongoing_means_not_finished_and_not_canceled():
    assert is_ongoing("ready") and is_ongoing("performing") and is_ongoing("paused")
    assert not is_ongoing("finished") and not is_ongoing("canceled")


WORKFLOW_ALLOWED = {
    "ready": {"ready", "performing", "canceled", "paused", "finished"},
    "performing": {"ready", "performing", "canceled", "paused", "finished"},
    # resume()/skip()/resume_at() -> ready; resume() while the body runs -> performing; cancel().
    "paused": {"ready", "performing", "canceled"},
    "finished": set(),
    "canceled": set(),
}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(WORKFLOW_STATES, repeat=2)))
def test_workflow_transition_table(old, new):
    assert set(WORKFLOW_TRANSITIONS[old]) == WORKFLOW_ALLOWED[old]
    if old == new:
        # Same-state is a silent no-op, even from the states with no exits.
        assert check_workflow_transition(old, new) is False
    elif new in WORKFLOW_ALLOWED[old]:
        assert check_workflow_transition(old, new) is True
    else:
        with pytest.raises(InvalidTransitionError) as info:
            check_workflow_transition(old, new)
        assert str(info.value) == f"Cannot transition workflow from '{old}' to '{new}'"


STEP_ALLOWED = {
    "scheduled": {
        "scheduled",
        "waiting",
        "in_progress",
        "canceled",
        "skipped",
        "failed",
        "completed",
    },
    "waiting": {"scheduled", "canceled", "skipped"},
    "in_progress": {"in_progress", "completed", "failed", "canceled", "skipped"},
    "completed": set(),
    "failed": set(),
    "canceled": set(),
    "skipped": set(),
}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(STEP_STATES, repeat=2)))
def test_step_transition_table_has_no_same_state_shortcut(old, new):
    assert set(STEP_TRANSITIONS[old]) == STEP_ALLOWED[old]
    if new in STEP_ALLOWED[old]:
        check_step_transition(old, new)
    else:
        with pytest.raises(InvalidTransitionError) as info:
            check_step_transition(old, new)
        assert str(info.value) == f"Cannot transition step execution from '{old}' to '{new}'"


@pytest.mark.parametrize(
    ("new_state", "columns"),
    [
        ("in_progress", {"started_at"}),
        ("completed", {"completed_at", "finished_at"}),
        ("failed", {"failed_at", "finished_at"}),
        ("skipped", {"skipped_at", "finished_at"}),
        ("canceled", {"canceled_at", "finished_at"}),
        ("waiting", set()),
    ],
)
def test_executor_step_transition_writes_the_state_timestamps(new_state, columns):
    all_columns = {
        "started_at",
        "completed_at",
        "failed_at",
        "skipped_at",
        "canceled_at",
        "finished_at",
        "waiting_since",
    }
    execution = StepExecution(step_name="x", state="scheduled", scheduled_for=utcnow())
    transition_step(execution, new_state, "success" if new_state == "completed" else None)
    assert execution.state == new_state
    for column in all_columns:
        value = getattr(execution, column)
        if column in columns:
            assert_recent(value)
        else:
            assert value is None, f"{column} should stay NULL for {new_state}"


def test_executor_step_transition_refuses_illegal_moves():
    execution = StepExecution(step_name="x", state="completed", scheduled_for=utcnow())
    with pytest.raises(InvalidTransitionError):
        transition_step(execution, "in_progress")
    assert execution.state == "completed"


@pytest.mark.parametrize("new_state", ["finished", "canceled", "paused"])
def test_entering_finished_canceled_or_paused_sets_transitioned_at(new_state):
    workflow = Workflow(state="ready")
    transition_workflow(workflow, new_state)
    assert workflow.state == new_state
    assert_recent(workflow.transitioned_at)


@pytest.mark.parametrize("new_state", ["ready", "performing"])
def test_entering_ready_or_performing_leaves_transitioned_at_alone(new_state):
    workflow = Workflow(state="performing" if new_state == "ready" else "ready")
    transition_workflow(workflow, new_state)
    assert workflow.state == new_state
    assert workflow.transitioned_at is None


def test_transition_out_of_a_terminal_state_raises():
    workflow = Workflow(state="finished")
    with pytest.raises(InvalidTransitionError, match="from 'finished' to 'ready'"):
        transition_workflow(workflow, "ready")


class StatesPointerWorkflow(Workflow):
    seen: list = []

    @step
    def first(self):
        StatesPointerWorkflow.seen.append((self.state, self.current_step_name, self.next_step_name))

    @step
    def second(self):
        StatesPointerWorkflow.seen.append((self.state, self.current_step_name, self.next_step_name))


def test_step_pointers_during_and_after_a_run(geneva_session):
    StatesPointerWorkflow.seen = []
    wf = StatesPointerWorkflow.create(hero=make_order(geneva_session))
    assert (wf.state, wf.current_step_name, wf.next_step_name) == ("ready", None, "first")
    assert wf.previous_step_name is None

    perform_next_step(wf)
    # current_step_name is set only while the body runs; next_step_name names the newest execution.
    assert StatesPointerWorkflow.seen == [("performing", "first", "first")]
    assert (wf.state, wf.current_step_name, wf.next_step_name) == ("ready", None, "second")
    assert wf.previous_step_name == "first"

    speedrun_workflow(wf)
    assert StatesPointerWorkflow.seen[-1] == ("performing", "second", "second")
    # finishing through "no next step" clears both pointers and stamps transitioned_at
    assert (wf.state, wf.current_step_name, wf.next_step_name) == ("finished", None, None)
    assert_recent(wf.transitioned_at)
    assert wf.previous_step_name == "second"
    assert not wf.is_ongoing


def test_current_execution_and_history(geneva_session):
    wf = StatesPointerWorkflow.create(hero=make_order(geneva_session))
    first = wf.current_execution
    assert first is not None and first.step_name == "first" and first.state == "scheduled"
    perform_next_step(wf)
    history = wf.execution_history
    assert [(e.step_name, e.state, e.outcome) for e in history] == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]
    assert wf.current_execution.id == history[1].id
    speedrun_workflow(wf)
    assert wf.current_execution is None
    assert [e.created_at for e in wf.execution_history] == sorted(
        e.created_at for e in wf.execution_history
    )


def test_is_overdue_only_for_scheduled_executions_in_the_past():
    from datetime import timedelta

    past = utcnow() - timedelta(minutes=1)
    assert StepExecution(state="scheduled", scheduled_for=past).is_overdue
    assert not StepExecution(
        state="scheduled", scheduled_for=utcnow() + timedelta(hours=1)
    ).is_overdue
    assert not StepExecution(state="in_progress", scheduled_for=past).is_overdue
    assert not StepExecution(state="waiting", scheduled_for=past).is_overdue


def test_error_hierarchy():
    from geneva_drive import errors

    for name in (
        "InvalidStateError",
        "StepConfigurationError",
        "StepNotDefinedError",
        "CursorTooLargeError",
        "SignalPayloadTooLargeError",
        "WorkflowNotOngoingError",
        "InvalidTransitionError",
        "DuplicateWorkflowError",
    ):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.EngineError) and issubclass(cls, Exception)
    assert issubclass(errors.StepNotDefinedError, errors.StepExecutionError)
    # A step's own exception is re-raised as itself: no wrappers that nothing raises.
    assert not hasattr(errors, "StepFailedError") and not hasattr(errors, "PreconditionError")
    # Each name ends in Error; the gem's names are the same classes.
    assert errors.InvalidStateTransition is errors.InvalidTransitionError
    assert errors.WorkflowNotOngoing is errors.WorkflowNotOngoingError
    # It carries ids and names, not the rows: it outlives the session that raised it.
    execution = StepExecution(id=7, step_name="gone_step")
    error = errors.StepNotDefinedError(
        "gone", step_execution=execution, workflow=StatesPointerWorkflow(id=3)
    )
    assert (str(error), error.step_execution_id, error.step_name) == ("gone", 7, "gone_step")
    assert (error.workflow_id, error.workflow_class) == (3, "StatesPointerWorkflow")
    assert not hasattr(error, "step_execution") and not hasattr(error, "workflow")
    bare = errors.StepNotDefinedError("gone")
    assert (bare.step_execution_id, bare.step_name, bare.workflow_id, bare.workflow_class) == (
        None,
        None,
        None,
        None,
    )


def test_previous_step_name_of_a_finished_workflow_is_the_last_step_even_a_gravestone(
    geneva_session,
):
    from geneva_drive import removed_step

    class StatesTrailingGrave(Workflow):
        @step
        def a(self):
            pass

        gone = removed_step()

    wf = StatesTrailingGrave.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert wf.previous_step_name == "gone"
