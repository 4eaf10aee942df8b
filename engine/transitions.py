"""Every change of a workflow's or a step execution's state, with the columns that go with it.

This is the only code that assigns ``state`` (and ``current_step_name``, ``next_step_name``,
``transitioned_at``, ``outcome`` and the execution timestamps, ``finished_at`` included). The
executor, the operator actions, scheduling, signals and housekeeping call one function per
transition; each asks the tables of :mod:`geneva_drive.states` whether the move is legal
(:class:`~geneva_drive.errors.InvalidTransitionError` otherwise) and then writes the state with
all of its bookkeeping, so no caller can forget a column. (the copies that lived in
five modules had drifted - an operator's skip left ``finished_at`` NULL and
``current_step_name`` pointing at the step it skipped, which scheduling then counted from.)

The rules the functions keep (tests/reliability/invariants.py checks them):

* ``current_step_name`` is set exactly while the workflow is ``performing``: entering
  ``performing`` names the running step; entering any other state clears it.
* ``transitioned_at`` is set on entering ``paused``, ``finished`` or ``canceled`` and cleared
  when a workflow leaves ``paused``.
* every closed execution has ``finished_at`` and the timestamp of its state
  (``STEP_STATE_TIMESTAMP``), and an outcome the state allows (``STEP_STATE_OUTCOMES``).

Nothing here touches the database, with one exception: a workflow that has a parent, or whose
class has ``cancel_children``, reports its end (finished, canceled) through
:mod:`geneva_drive.children` as it enters it, so that no path that ends a workflow can forget
its parent or its children (docs/MANUAL.md, "Fan-out and join: child workflows"). The caller holds the locks and owns the transaction.
The executor calls these on every step, so each is a few attribute writes and a dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from geneva_drive import current_worker
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import (
    FINAL_STEP_STATES,
    STEP_STATE_TIMESTAMP,
    Outcome,
    StepState,
    TimeoutAction,
    WorkflowState,
    check_step_transition,
    check_workflow_transition,
)

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow

_STAMPED_WORKFLOW_STATES = frozenset(
    {WorkflowState.FINISHED, WorkflowState.CANCELED, WorkflowState.PAUSED}
)


# --- step executions ---------------------------------------------------------------------------


def transition_step(execution: StepExecution, new_state: str, outcome: str | None = None) -> None:
    """Move ``execution`` to ``new_state`` with its timestamp(s) and ``outcome``, if legal.

    The primitive under the named transitions below (no same-state shortcut).
    """
    check_step_transition(execution.state, new_state)
    now = utcnow()
    execution.state = new_state
    column = STEP_STATE_TIMESTAMP.get(new_state)
    if column is not None:
        setattr(execution, column, now)
    if new_state in FINAL_STEP_STATES:
        execution.finished_at = now
    if outcome is not None:
        execution.outcome = outcome


def start_execution(execution: StepExecution) -> None:
    """scheduled -> in_progress (the executor's start; ``started_at``), recording the worker
    that runs it (``worker_id``; None outside a registered worker) in the same statement."""
    transition_step(execution, StepState.IN_PROGRESS)
    execution.worker_id = current_worker.get()


def park_execution(
    execution: StepExecution, awaiting: str | None = None, timeout: timedelta | None = None
) -> None:
    """scheduled -> waiting: parked at the signal gate (``waiting_since``).

    ``awaiting`` (the signal name the step waited for when it parked) goes into the
    execution's metadata, so ``check-deploy`` can tell when new code changed a ``wait_for``
    under executions still waiting (docs/MANUAL.md, "Changing workflows in production"); a step with ``timeout=`` starts its clock
    here (``timeout_at``, docs/MANUAL.md, "Time-bounded waits").
    """
    transition_step(execution, StepState.WAITING)
    execution.waiting_since = since = utcnow()
    if awaiting is not None:
        execution.merge_metadata(awaiting=awaiting)
    if timeout is not None:
        execution.timeout_at = since + timeout


def arm_timeout(execution: StepExecution, timeout_at: datetime | None) -> None:
    """Give a parked execution its deadline (or none): one parked before a deploy added
    ``timeout=`` to its step, or whose step dropped it (engine/timeouts.py)."""
    execution.timeout_at = timeout_at


def time_out_execution(execution: StepExecution, action: str) -> None:
    """waiting -> what ``on_timeout`` says, recording ``timed_out_at`` (docs/MANUAL.md, "Time-bounded waits").

    ``"run"``: woken to scheduled, due now; it passes the gate without a signal and ends with
    outcome ``timed_out`` when its body completes. ``"skip"``: skipped, ``"cancel"`` and
    ``"pause"``: canceled, each with outcome ``timed_out``. The workflow's side is the
    caller's (workflow_canceled, workflow_paused, the next step).
    """
    if action == TimeoutAction.RUN:
        wake_execution(execution)
    elif action == TimeoutAction.SKIP:
        transition_step(execution, StepState.SKIPPED, Outcome.TIMED_OUT)
    else:
        transition_step(execution, StepState.CANCELED, Outcome.TIMED_OUT)
    execution.timed_out_at = utcnow()


def carry_time_out(execution: StepExecution, timed_out_at: datetime) -> None:
    """Another run of a timed-out ``on_timeout="run"`` step (reattempt, next slice) passes
    the gate without a signal, as the first run did."""
    execution.timed_out_at = timed_out_at


def run_outcome(execution: StepExecution) -> str:
    """The outcome of a body that completed (or called ``finish()``): ``timed_out`` after
    ``on_timeout="run"``, ``success`` otherwise."""
    return Outcome.SUCCESS if execution.timed_out_at is None else Outcome.TIMED_OUT


def wake_execution(execution: StepExecution) -> None:
    """waiting -> scheduled, due now: a matching signal arrived (or the gate went away)."""
    transition_step(execution, StepState.SCHEDULED)
    execution.scheduled_for = utcnow()
    execution.waiting_since = None


def complete_execution(execution: StepExecution, outcome: str = Outcome.SUCCESS) -> None:
    """-> completed (success, continued, reattempted, workflow_paused or recovered)."""
    transition_step(execution, StepState.COMPLETED, outcome)


def fail_execution(execution: StepExecution, outcome: str = Outcome.FAILED) -> None:
    """-> failed (outcome failed, or canceled by a cancel policy); the error is the caller's."""
    transition_step(execution, StepState.FAILED, outcome)


def skip_execution(execution: StepExecution) -> None:
    """-> skipped (skip_if, skip policy, removed step, an operator's skip)."""
    transition_step(execution, StepState.SKIPPED, Outcome.SKIPPED)


def cancel_execution(execution: StepExecution, outcome: str = Outcome.CANCELED) -> None:
    """-> canceled (outcome canceled, or recovered by housekeeping)."""
    transition_step(execution, StepState.CANCELED, outcome)


def swept_columns(now: Any) -> dict[str, Any]:
    """The columns of the bulk "stray" sweep (scheduled/waiting -> canceled, one UPDATE).

    ``now`` is a datetime or a bind parameter: the sweep is prebuilt once
    (engine/persistence.py). The same columns as :func:`cancel_execution` writes.
    """
    return {
        "state": StepState.CANCELED,
        "outcome": Outcome.CANCELED,
        "canceled_at": now,
        "finished_at": now,
        "updated_at": now,
    }


#: What a swept execution's loaded copy must reload (scheduling.cancel_stray_executions).
SWEPT_ATTRIBUTES = ("state", "outcome", "canceled_at", "finished_at", "updated_at")


def new_execution_columns(scheduled_for: datetime) -> dict[str, Any]:
    """The state columns of a new execution: scheduled, due at ``scheduled_for``."""
    return {"state": StepState.SCHEDULED, "scheduled_for": scheduled_for}


# --- workflows ---------------------------------------------------------------------------------


def new_workflow_columns() -> dict[str, Any]:
    """The state columns of a new workflow: ready, on no step yet."""
    return {"state": WorkflowState.READY}


def transition_workflow(workflow: Workflow, new_state: str, step_name: str | None = None) -> None:
    """Move ``workflow`` to ``new_state`` with ``transitioned_at`` and ``current_step_name``.

    Same-state is a silent no-op for the state. ``step_name`` names the
    running step on entering ``performing``; every other state clears ``current_step_name``.
    Columns are written only when they change: the executor's row write stays minimal.
    """
    old = workflow.state
    if check_workflow_transition(old, new_state):
        workflow.state = new_state
        if new_state in _STAMPED_WORKFLOW_STATES:
            workflow.transitioned_at = utcnow()
        elif old == WorkflowState.PAUSED:
            workflow.transitioned_at = None
    current = step_name if new_state == WorkflowState.PERFORMING else None
    if workflow.current_step_name != current:
        workflow.current_step_name = current
    if new_state in (WorkflowState.FINISHED, WorkflowState.CANCELED):
        # Here, not in the callers: every way into an end (the outcome table's one transition
        # included) reports a child's end to its parent and cascades cancel_children.
        _ended(workflow, old)


def workflow_performing(workflow: Workflow, step_name: str) -> None:
    """ready -> performing as ``step_name``'s body starts; paused -> performing when resumed
    while that body still runs."""
    transition_workflow(workflow, WorkflowState.PERFORMING, step_name)


def workflow_ready(workflow: Workflow) -> None:
    """-> ready: the step is over (performing), or an operator moved a paused workflow on."""
    transition_workflow(workflow, WorkflowState.READY)


def workflow_paused(workflow: Workflow) -> None:
    """-> paused (an operator, a step's pause(), a pause policy, a step no longer defined)."""
    transition_workflow(workflow, WorkflowState.PAUSED)


def workflow_canceled(workflow: Workflow) -> None:
    """-> canceled. Terminal."""
    transition_workflow(workflow, WorkflowState.CANCELED)


def workflow_finished(workflow: Workflow, *, out_of_steps: bool = False) -> None:
    """-> finished. Terminal. ``out_of_steps``: no step follows, so ``next_step_name`` is
    cleared too; ``finish()`` in a step keeps it naming that step."""
    if out_of_steps:
        workflow.next_step_name = None
    transition_workflow(workflow, WorkflowState.FINISHED)


#: geneva_drive.children registers itself here when imported (it sits above this module).
_end_hook: list[Callable[[Workflow], None]] = []


def on_workflow_end(hook: Callable[[Workflow], None]) -> None:
    """Register what runs as a workflow with a parent or ``cancel_children`` ends."""
    _end_hook[:] = [hook]


def _ended(workflow: Workflow, old: str) -> None:
    """A child's end reaches its parent; a ``cancel_children`` parent's reaches its children."""
    if (
        old != workflow.state
        and _end_hook
        and (workflow.parent_id is not None or type(workflow).cancel_children)
    ):
        _end_hook[0](workflow)


def point_at(workflow: Workflow, step_name: str) -> None:
    """``next_step_name`` names the step of the execution just created."""
    if workflow.next_step_name != step_name:  # unchanged: no UPDATE of the workflow row
        workflow.next_step_name = step_name


__all__ = [
    "SWEPT_ATTRIBUTES",
    "arm_timeout",
    "cancel_execution",
    "carry_time_out",
    "complete_execution",
    "fail_execution",
    "new_execution_columns",
    "new_workflow_columns",
    "on_workflow_end",
    "park_execution",
    "point_at",
    "run_outcome",
    "skip_execution",
    "start_execution",
    "swept_columns",
    "time_out_execution",
    "transition_step",
    "transition_workflow",
    "wake_execution",
    "workflow_canceled",
    "workflow_finished",
    "workflow_paused",
    "workflow_performing",
    "workflow_ready",
]
