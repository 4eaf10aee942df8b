"""What "overdue", "stuck" and "waiting too long" mean, defined once.

Housekeeping recovers what this module calls stuck; the metrics snapshot (``/metrics``, the
gauges), the dashboard's filters, counts and badges count and show the same rows, so a number
on the overview is exactly what the next housekeeping run will act on.

* **overdue** - a ``scheduled`` execution whose ``scheduled_for`` lies further back than
  ``settings.overdue_after`` (the dispatch interval plus ``GENEVA_OVERDUE_GRACE``). Counted only for
  workflows the executor would run (``RUNNABLE_WORKFLOW_STATES``): a paused workflow's preserved
  execution waits for ``resume()`` on purpose.
* **stuck in progress** - ``in_progress`` longer than ``settings.stuck_in_progress_threshold``
  and started outside a registered worker (``worker_id`` NULL: the test helpers, an older
  version): housekeeping recovers it. An execution a registered worker started is judged by
  that worker's lease instead (engine/liveness.py), never by its age.
* **stuck scheduled** - overdue by more than ``settings.stuck_scheduled_threshold`` *and* whose
  message was never sent or was sent longer ago than that threshold, of a workflow that is not
  paused: housekeeping recovers it (a finished or canceled workflow's orphan is only closed).
  A row the dispatcher sent recently is waiting in the broker's queue behind a backlog;
  recovering it would only add one more message to that backlog.
* **waiting too long** - parked at the signal gate (``waiting``) for longer than
  ``settings.waiting_visibility_threshold`` (None: never).

The SQL forms use the execution table's columns, so they serve ORM and Core queries alike.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_

from geneva_drive import states
from geneva_drive.config import settings
from geneva_drive.models import StepExecution
from geneva_drive.states import RUNNABLE_WORKFLOW_STATES, StepState, WorkflowState

_ex = StepExecution.__table__.c

#: Workflow states whose overdue executions count as overdue.
OVERDUE_WORKFLOW_STATES = RUNNABLE_WORKFLOW_STATES
#: The one workflow state whose stale scheduled executions are not stuck (kept for resume()).
NOT_STUCK_WORKFLOW_STATE = WorkflowState.PAUSED


# --- cutoffs -------------------------------------------------------------------------------------


def overdue_cutoff(now: datetime) -> datetime:
    """Due before this is overdue: the dispatcher gets its interval plus the grace
    (``settings.overdue_after``), so a freshly due execution is "due now", not late."""
    return now - settings.overdue_after


def stuck_in_progress_cutoff(now: datetime) -> datetime:
    return now - settings.stuck_in_progress_threshold


def stuck_scheduled_cutoff(now: datetime) -> datetime:
    return now - settings.stuck_scheduled_threshold


def waiting_cutoff(now: datetime) -> datetime | None:
    threshold = settings.waiting_visibility_threshold
    return None if threshold is None else now - threshold


# --- one execution -------------------------------------------------------------------------------


def is_overdue(execution: StepExecution, now: datetime) -> bool:
    return states.is_overdue(execution.state, execution.scheduled_for, overdue_cutoff(now))


def is_stuck(execution: StepExecution, now: datetime) -> bool:
    """Stuck in progress or stuck scheduled (the workflow's state is the caller's check)."""
    if execution.state == StepState.IN_PROGRESS:
        started = execution.started_at
        return (
            execution.worker_id is None
            and started is not None
            and started < stuck_in_progress_cutoff(now)
        )
    if execution.state == StepState.SCHEDULED:
        cutoff = stuck_scheduled_cutoff(now)
        sent = execution.sent_at
        return execution.scheduled_for < cutoff and (sent is None or sent < cutoff)
    return False


def is_waiting_too_long(execution: StepExecution, now: datetime) -> bool:
    cutoff = waiting_cutoff(now)
    if execution.state != StepState.WAITING or cutoff is None:
        return False
    return (execution.waiting_since or execution.created_at) < cutoff


# --- SQL -----------------------------------------------------------------------------------------


def overdue_condition(now: datetime) -> Any:
    """Executions that are overdue (join the workflow for OVERDUE_WORKFLOW_STATES)."""
    return and_(_ex.state == StepState.SCHEDULED, _ex.scheduled_for < overdue_cutoff(now))


def stuck_in_progress_condition(now: datetime) -> Any:
    """In progress too long, started outside a registered worker (the liveness sweep judges
    the others)."""
    return and_(
        _ex.state == StepState.IN_PROGRESS,
        _ex.started_at < stuck_in_progress_cutoff(now),
        _ex.worker_id.is_(None),
    )


def stuck_scheduled_condition(now: datetime) -> Any:
    """Executions stuck scheduled (join the workflow: not NOT_STUCK_WORKFLOW_STATE): overdue
    past the threshold, and never sent or sent longer ago than it."""
    cutoff = stuck_scheduled_cutoff(now)
    return and_(
        _ex.state == StepState.SCHEDULED,
        _ex.scheduled_for < cutoff,
        or_(_ex.sent_at.is_(None), _ex.sent_at < cutoff),
    )
