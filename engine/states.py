"""The one state machine of the engine.

Every other module (executor, flow control, housekeeping, dispatcher, dashboard presenters)
asks this module whether a state is ongoing, terminal or active, and which transitions are
legal. Nothing here touches the database.

Workflow states (``WORKFLOW_TRANSITIONS``)::

    ready ──▶ performing ──▶ ready ...        (one step after another)
      │            │
      ├──▶ paused ◀┤          (operator or exception policy)
      ├──▶ finished ◀┤        (terminal)
      └──▶ canceled ◀┘        (terminal)

    paused ──▶ ready          (resume(), skip(), resume_at(), reattempt())
    paused ──▶ performing     (resume() while the paused step's body still runs)
    paused ──▶ canceled       (cancel(); housekeeping recovering a stuck step with "cancel")

Step execution states (``STEP_TRANSITIONS``)::

    scheduled ──▶ in_progress ──▶ completed | failed | canceled | skipped
        │  ▲
        ▼  │
      waiting   (parked at the signal gate; woken back to scheduled by a signal, or by a
                 time-out with on_timeout="run"; closed skipped or canceled by the others)
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from geneva_drive.errors import InvalidTransitionError

# The functions that perform these transitions, with their bookkeeping, are in
# geneva_drive.transitions; this module only says what exists and what is legal.


class WorkflowState(StrEnum):
    #: Waiting for its next step execution to run (or parked on a signal).
    READY = "ready"
    #: A step body is running right now.
    PERFORMING = "performing"
    #: Stopped by an operator or an exception policy; keeps its uniqueness slot.
    PAUSED = "paused"
    #: Ran out of steps, or a step called ``finish()``. Terminal.
    FINISHED = "finished"
    #: Canceled by a condition, a step, a policy or an operator. Terminal.
    CANCELED = "canceled"


class StepState(StrEnum):
    #: Created and due at ``scheduled_for``; the only state the executor starts.
    SCHEDULED = "scheduled"
    #: Parked at the signal gate until a matching signal arrives.
    WAITING = "waiting"
    #: The body is running.
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    SKIPPED = "skipped"


class Outcome(StrEnum):
    SUCCESS = "success"
    CONTINUED = "continued"
    REATTEMPTED = "reattempted"
    SKIPPED = "skipped"
    CANCELED = "canceled"
    FAILED = "failed"
    RECOVERED = "recovered"
    WORKFLOW_PAUSED = "workflow_paused"
    #: The wait for a signal ran past the step's ``timeout=`` and ``on_timeout=`` acted
    #: (docs/MANUAL.md, "Time-bounded waits"): on the parked execution, or for ``"run"`` on the execution that ran.
    TIMED_OUT = "timed_out"


class ChildFailureAction(StrEnum):
    """What a step's ``on_child_failure=`` does when a child it waited for ended canceled
    (docs/MANUAL.md, "Fan-out and join: child workflows")."""

    #: The join's execution ends canceled and the workflow is paused; resume() runs the step.
    PAUSE = "pause"
    #: The join's execution and the workflow end canceled.
    CANCEL = "cancel"
    #: The step runs as if every child had finished.
    CONTINUE = "continue"


class TimeoutAction(StrEnum):
    """What a step's ``on_timeout=`` does when its wait for a signal runs out (docs/MANUAL.md, "Time-bounded waits")."""

    #: The body runs without a signal (``received_signal is None``, ``wait_timed_out``).
    RUN = "run"
    #: The execution ends skipped and the workflow moves on to the next step.
    SKIP = "skip"
    #: The execution and the workflow end canceled.
    CANCEL = "cancel"
    #: The execution ends canceled and the workflow is paused; resume() parks the step again.
    PAUSE = "pause"


class Operation(StrEnum):
    """An operator action on a workflow from outside its steps (engine/operations.py); the
    dashboard's buttons, its audit log and the bulk actions use these names."""

    PAUSE = "pause"
    RESUME = "resume"
    SKIP = "skip"
    CANCEL = "cancel"
    REATTEMPT = "reattempt"
    RESUME_AT = "resume_at"
    SIGNAL = "signal"


#: The operations an operator may apply to many workflows at once, in display order (skip and
#: signal need a look at each workflow first; reattempt is for a group of failures, each of
#: which the engine refuses unless it is paused).
BULK_OPERATIONS: tuple[Operation, ...] = (
    Operation.PAUSE,
    Operation.RESUME,
    Operation.CANCEL,
    Operation.RESUME_AT,
    Operation.REATTEMPT,
)


class SignalState(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    CONSUMED = "consumed"


#: Workflows that still hold their hero's uniqueness slot.
ONGOING_WORKFLOW_STATES = frozenset(
    {WorkflowState.READY, WorkflowState.PERFORMING, WorkflowState.PAUSED}
)
#: Workflows that will never run another step.
TERMINAL_WORKFLOW_STATES = frozenset({WorkflowState.FINISHED, WorkflowState.CANCELED})
#: Workflows whose scheduled executions the executor will start.
RUNNABLE_WORKFLOW_STATES = frozenset({WorkflowState.READY, WorkflowState.PERFORMING})

#: Executions covered by the one-active partial unique index.
ACTIVE_STEP_STATES = frozenset({StepState.SCHEDULED, StepState.IN_PROGRESS})
#: What ``current_execution`` looks for (``waiting`` is enforced by code, not the index).
CURRENT_STEP_STATES = frozenset({StepState.SCHEDULED, StepState.WAITING, StepState.IN_PROGRESS})
#: Executions a new execution sweeps away (the "stray" sweep).
STRAY_STEP_STATES = frozenset({StepState.SCHEDULED, StepState.WAITING})
#: Executions that are over.
FINAL_STEP_STATES = frozenset(
    {StepState.COMPLETED, StepState.FAILED, StepState.CANCELED, StepState.SKIPPED}
)

WORKFLOW_TRANSITIONS: dict[str, frozenset[str]] = {
    WorkflowState.READY: frozenset(
        {
            WorkflowState.READY,
            WorkflowState.PERFORMING,
            WorkflowState.CANCELED,
            WorkflowState.PAUSED,
            WorkflowState.FINISHED,
        }
    ),
    WorkflowState.PERFORMING: frozenset(
        {
            WorkflowState.READY,
            WorkflowState.PERFORMING,
            WorkflowState.CANCELED,
            WorkflowState.PAUSED,
            WorkflowState.FINISHED,
        }
    ),
    # The gem's executor table has no exit from paused; its operator methods leave it
    # outside the table. Here every writer goes through the table, so it says what they do.
    WorkflowState.PAUSED: frozenset(
        {WorkflowState.READY, WorkflowState.PERFORMING, WorkflowState.CANCELED}
    ),
    WorkflowState.FINISHED: frozenset(),
    WorkflowState.CANCELED: frozenset(),
}

STEP_TRANSITIONS: dict[str, frozenset[str]] = {
    StepState.SCHEDULED: frozenset(
        {
            StepState.SCHEDULED,
            StepState.WAITING,
            StepState.IN_PROGRESS,
            StepState.CANCELED,
            StepState.SKIPPED,
            StepState.FAILED,
            StepState.COMPLETED,
        }
    ),
    StepState.WAITING: frozenset({StepState.SCHEDULED, StepState.CANCELED, StepState.SKIPPED}),
    StepState.IN_PROGRESS: frozenset(
        {
            StepState.IN_PROGRESS,
            StepState.COMPLETED,
            StepState.FAILED,
            StepState.CANCELED,
            StepState.SKIPPED,
        }
    ),
    StepState.COMPLETED: frozenset(),
    StepState.FAILED: frozenset(),
    StepState.CANCELED: frozenset(),
    StepState.SKIPPED: frozenset(),
}

#: The timestamp column a step transition writes for each new state (plus ``finished_at`` for
#: every state in FINAL_STEP_STATES).
STEP_STATE_TIMESTAMP: dict[str, str] = {
    StepState.IN_PROGRESS: "started_at",
    StepState.COMPLETED: "completed_at",
    StepState.FAILED: "failed_at",
    StepState.SKIPPED: "skipped_at",
    StepState.CANCELED: "canceled_at",
}

#: Every (state, outcome) pair a step execution may hold. Live
#: executions carry no outcome; each final state allows only the outcomes its producers write.
STEP_STATE_OUTCOMES: dict[str, frozenset[str | None]] = {
    StepState.SCHEDULED: frozenset({None}),
    StepState.WAITING: frozenset({None}),
    StepState.IN_PROGRESS: frozenset({None}),
    StepState.COMPLETED: frozenset(
        {
            Outcome.SUCCESS,
            Outcome.REATTEMPTED,
            Outcome.CONTINUED,
            Outcome.WORKFLOW_PAUSED,
            Outcome.RECOVERED,
            Outcome.TIMED_OUT,  # on_timeout="run": the body ran without a signal
        }
    ),
    # on_timeout="cancel" and "pause" close the parked execution canceled, "skip" skipped.
    StepState.CANCELED: frozenset({Outcome.CANCELED, Outcome.RECOVERED, Outcome.TIMED_OUT}),
    StepState.SKIPPED: frozenset({Outcome.SKIPPED, Outcome.TIMED_OUT}),
    StepState.FAILED: frozenset({Outcome.FAILED, Outcome.CANCELED}),
}


def is_legal_step_outcome(state: str, outcome: str | None) -> bool:
    """True when a step execution may hold ``outcome`` in ``state`` (see STEP_STATE_OUTCOMES)."""
    return outcome in STEP_STATE_OUTCOMES.get(state, frozenset())


#: Outcomes that close a signal's attachment cleanly (``Signal.fully_resolved``).
RESOLVING_OUTCOMES = frozenset({Outcome.SUCCESS, Outcome.SKIPPED})


def is_ongoing(state: str) -> bool:
    return state in ONGOING_WORKFLOW_STATES


def is_terminal(state: str) -> bool:
    return state in TERMINAL_WORKFLOW_STATES


def is_runnable(state: str) -> bool:
    return state in RUNNABLE_WORKFLOW_STATES


def check_workflow_transition(old: str, new: str) -> bool:
    """Validate a workflow transition (geneva_drive.transitions performs it).

    Returns False for a same-state transition (a silent no-op, as in the gem) and True when
    the state should change. Raises :class:`InvalidTransitionError` otherwise.
    """
    if old == new:
        return False
    if new not in WORKFLOW_TRANSITIONS.get(old, frozenset()):
        raise InvalidTransitionError(f"Cannot transition workflow from '{old}' to '{new}'")
    return True


def check_step_transition(old: str, new: str) -> None:
    """Validate a step-execution transition (no same-state shortcut)."""
    if new not in STEP_TRANSITIONS.get(old, frozenset()):
        raise InvalidTransitionError(f"Cannot transition step execution from '{old}' to '{new}'")


def is_still_running(workflow_state: str, execution_state: str) -> bool:
    """True while a step body may go on: its execution is in progress and the workflow is
    performing it. A resumable step asks this at every checkpoint; once an operator paused,
    skipped, canceled or resumed the workflow elsewhere it is False and the body stops."""
    return execution_state == StepState.IN_PROGRESS and workflow_state == WorkflowState.PERFORMING


def is_overdue(state: str, scheduled_for: datetime, due_before: datetime) -> bool:
    """A scheduled execution due before ``due_before`` (engine/lateness.py: the cutoff, which
    allows the dispatcher its interval plus ``settings.overdue_grace``)."""
    return state == StepState.SCHEDULED and scheduled_for < due_before


# Operator predicates: the dashboard's buttons and the flow-control methods ask these, so the
# rules of the gem live in exactly one place.


def can_pause(state: str) -> bool:
    # The gem allows only ready. We also let an operator pause a performing workflow: the
    # running step is not killed; a resumable step stops at its next checkpoint (outcome
    # workflow_paused), an ordinary step's result is discarded and the step runs again on resume.
    return state in RUNNABLE_WORKFLOW_STATES


def can_resume(state: str) -> bool:
    return state == WorkflowState.PAUSED


def can_cancel(state: str) -> bool:
    return state in ONGOING_WORKFLOW_STATES


def can_skip(state: str) -> bool:
    return state in (WorkflowState.READY, WorkflowState.PAUSED)


def can_resume_at(state: str) -> bool:
    return state == WorkflowState.PAUSED


def can_signal(state: str) -> bool:
    return is_ongoing(state)


_OPERATION_ALLOWED = (
    (Operation.PAUSE, can_pause),
    (Operation.RESUME, can_resume),
    (Operation.SKIP, can_skip),
    (Operation.CANCEL, can_cancel),
    (Operation.REATTEMPT, can_resume),
    (Operation.RESUME_AT, can_resume_at),
    (Operation.SIGNAL, can_signal),
)


def allowed_operator_actions(state: str) -> list[Operation]:
    """The operator actions that make sense for a workflow in ``state``, in display order."""
    return [operation for operation, allowed in _OPERATION_ALLOWED if allowed(state)]
