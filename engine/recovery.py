"""Recovering one execution whose step will not finish on its own.

Two sweeps find such executions: housekeeping's stuck recovery (an execution in progress longer
than ``stuck_in_progress_threshold`` with no worker recorded, a scheduled one whose message is
older than ``stuck_scheduled_threshold``) and worker liveness (an execution whose worker's lease
expired, engine/liveness.py). Both recover a row the same way, here, through
``settings.stuck_recovery_action``:

* ``"reattempt"`` — the execution becomes completed/recovered and the step runs again: a
  resumable step gets a successor that continues from the persisted cursor (no restart), any
  other step a new scheduled execution.
* ``"cancel"`` — the execution becomes canceled/recovered and the workflow canceled.

An execution of a finished or canceled workflow is only closed (canceled/recovered); one of a
paused workflow is closed without scheduling another (``resume()`` then runs the step again).
A concurrency slot the execution held is freed and the next execution waiting for it woken.

Each recovery is its own transaction. It locks the workflow (``SKIP LOCKED``: one held right now
is being worked on, and the next sweep looks again), then the execution, both read again, and
asks the caller's test once more under the lock, so two sweeps never recover one row twice and a
row a worker started meanwhile is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import db, limits, scheduling, transitions
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import ConfigurationError
from geneva_drive.instrumentation import ContextAdapter, log_context
from geneva_drive.models import StepExecution
from geneva_drive.states import Outcome, StepState, WorkflowState, is_terminal
from geneva_drive.workflow import Workflow

log = logging.getLogger("geneva_drive.housekeeping")

#: The caller's test, asked under the lock: is this execution still one to recover?
StillDue = Callable[[Session, StepExecution], bool]


def recover_execution(
    execution_id: int,
    still_due: StillDue,
    *,
    reason: str = "stuck",
    after: Callable[[Workflow, StepExecution], None] | None = None,
) -> bool:
    """Recover execution ``execution_id`` if ``still_due`` says so under the lock.

    Returns False when there was nothing to do: the row moved on, a worker started it meanwhile,
    or another process holds the workflow lock. ``after`` runs once the recovery committed
    (events, metrics). Raises what the recovery raises, after rolling back.
    """
    session = db.new_session()
    try:
        locked = lock(session, execution_id)
        if locked is None:
            session.rollback()
            return False
        workflow, execution = locked
        if not still_due(session, execution):
            # Re-checked under the lock: between the sweep's read and this lock a worker may
            # have started the execution (an overdue row of a backlog) or renewed its lease.
            # Recovering it now would discard a running step and run it twice.
            session.rollback()
            return False
        context = ContextAdapter(log, log_context(workflow, execution))
        was = execution.state
        _recover(session, workflow, execution)
        if was == StepState.IN_PROGRESS and (
            execution.limit_slot is not None or execution.step_limit_slot is not None
        ):
            session.flush()
            # Its slot is free: wake the next in line.
            limits.release(session, execution, scheduling.enqueue_execution)
        session.commit()
        context.warning(
            "recovered %s %s execution (%s): execution now %s/%s, workflow %s",
            reason,
            was,
            settings.stuck_recovery_action,
            execution.state,
            execution.outcome,
            workflow.state,
        )
        if after is not None:
            after(workflow, execution)
        return True
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def lock(session: Session, execution_id: int) -> tuple[Workflow, StepExecution] | None:
    """Lock an execution's workflow (skipped when held elsewhere: None), then the execution,
    both read again; None when either is gone or the workflow is busy."""
    db.begin_write(session)
    workflow_id = session.scalar(
        select(StepExecution.workflow_id).where(StepExecution.id == execution_id)
    )
    if workflow_id is None:
        return None
    row_locks = dialect_for(session).row_locks
    wf_query = (
        select(Workflow).where(Workflow.id == workflow_id).execution_options(populate_existing=True)
    )
    if row_locks:
        # A workflow locked right now is being worked on (an executor's finalize, an operator):
        # skip it this run instead of queueing behind it.
        wf_query = wf_query.with_for_update(skip_locked=True)
    workflow = session.scalars(wf_query).first()
    if workflow is None:
        return None
    ex_query = (
        select(StepExecution)
        .where(StepExecution.id == execution_id)
        .execution_options(populate_existing=True)
    )
    if row_locks:
        ex_query = ex_query.with_for_update()
    return workflow, session.scalars(ex_query).one()


def _recover(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    if is_terminal(workflow.state):
        # Nothing may run for a finished/canceled workflow; only close the orphan.
        transitions.cancel_execution(execution, Outcome.RECOVERED)
        return
    if settings.stuck_recovery_action == "cancel":
        transitions.cancel_execution(execution, Outcome.RECOVERED)
        transitions.workflow_canceled(workflow)
        return
    if settings.stuck_recovery_action != "reattempt":
        raise ConfigurationError(
            f"Unknown stuck_recovery_action: {settings.stuck_recovery_action!r}; set "
            "GENEVA_STUCK_RECOVERY_ACTION to reattempt or cancel"
        )
    transitions.complete_execution(execution, Outcome.RECOVERED)
    if workflow.state == WorkflowState.PAUSED:
        # Paused while its worker died: resume() decides when the step runs again.
        return
    transitions.workflow_ready(workflow)
    step_def = workflow.steps.named(execution.step_name)
    session.flush()
    if step_def is not None and step_def.resumable:
        scheduling.create_successor_execution(session, workflow, execution)
    else:
        scheduling.reschedule_current_step(session, workflow, current=execution.step_name)
