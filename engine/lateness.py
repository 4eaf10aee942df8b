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
* **held back late** - a ``scheduled`` execution a concurrency or rate limit deferred
  (``deferred_on``) whose wait began (``deferred_since``, else ``created_at``) further back
  than ``settings.overdue_after``: waiting that nobody chose, named by its limit and key. It is
  never also *overdue*: a deferred execution's ``scheduled_for`` is its next recheck or its
  token's time, not a time it should have started by.
* **running long** - ``in_progress`` longer than :func:`running_long_after` of its step's
  recent durations: the :data:`RUNNING_LONG_PERCENTILE` of the last finished executions of
  that class and step, times :data:`RUNNING_LONG_FACTOR`, at least :data:`RUNNING_LONG_FLOOR`.
  Shown, never acted on (stuck recovery and worker leases decide that).
* **waiting too long** - parked at the signal gate (``waiting``) for longer than
  ``settings.waiting_visibility_threshold`` (None: never).

The SQL forms use the execution table's columns, so they serve ORM and Core queries alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

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
    if execution.deferred_on is not None:
        return False  # held back by a limit: see is_held_late
    return states.is_overdue(execution.state, execution.scheduled_for, overdue_cutoff(now))


def held_since(execution: StepExecution) -> datetime:
    """When a limit began holding ``execution`` back (meaningful while ``deferred_on`` is set)."""
    return execution.deferred_since or execution.created_at


def is_held_late(execution: StepExecution, now: datetime) -> bool:
    """Deferred by a limit for longer than the overdue grace (``settings.overdue_after``)."""
    return (
        execution.state == StepState.SCHEDULED
        and execution.deferred_on is not None
        and held_since(execution) < overdue_cutoff(now)
    )


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
    return and_(
        _ex.state == StepState.SCHEDULED,
        _ex.scheduled_for < overdue_cutoff(now),
        _ex.deferred_on.is_(None),
    )


def held_since_column() -> Any:
    """:func:`held_since` in SQL."""
    return func.coalesce(_ex.deferred_since, _ex.created_at)


def held_late_condition(now: datetime) -> Any:
    """Executions held back late by a limit (the ``deferred_on`` index finds them; join the
    workflow for OVERDUE_WORKFLOW_STATES)."""
    return and_(
        _ex.deferred_on.is_not(None),
        _ex.state == StepState.SCHEDULED,
        held_since_column() < overdue_cutoff(now),
    )


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


# --- running long ------------------------------------------------------------------------------

#: The percentile of a step's recent durations that "usual" means.
RUNNING_LONG_PERCENTILE = 0.99
#: How many times that percentile a running step may take before it is flagged.
RUNNING_LONG_FACTOR = 10
#: Never flagged below this, however fast the step usually is (a slow network call is not news).
RUNNING_LONG_FLOOR = timedelta(minutes=1)
#: The history read: executions finished within this window, at most HISTORY_ROWS of them
#: (newest first, through the ``finished_at`` index), so the cost never grows with the table.
HISTORY_WINDOW = timedelta(hours=24)
HISTORY_ROWS = 5000
#: Fewer finished executions of a step than this in the history: no judgement from it.
HISTORY_MIN_SAMPLES = 5

#: (workflow class, step name)
StepKey = tuple[str, str]


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` percentile of ``values`` (nearest rank; ``values`` non-empty)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(fraction * len(ordered) + 0.999999) - 1))
    return ordered[rank]


def running_long_after(usual: timedelta) -> timedelta:
    """How long a step whose usual (percentile) duration is ``usual`` may run unflagged."""
    return max(RUNNING_LONG_FLOOR, usual * RUNNING_LONG_FACTOR)


def usual_durations(
    session: Session, steps: Iterable[StepKey], now: datetime
) -> dict[StepKey, timedelta]:
    """The :data:`RUNNING_LONG_PERCENTILE` duration of each of ``steps`` over its recent
    completed executions (one bounded query; a step with too little history is left out)."""
    wanted = set(steps)
    if not wanted:
        return {}
    workflows = StepExecution.metadata.tables["geneva_drive_workflows"]
    recent = (
        select(_ex.workflow_id, _ex.step_name, _ex.started_at, _ex.completed_at)
        .where(_ex.finished_at > now - HISTORY_WINDOW, _ex.state == StepState.COMPLETED)
        .order_by(_ex.finished_at.desc())
        .limit(HISTORY_ROWS)
        .subquery()
    )
    rows = session.execute(
        select(workflows.c.type, recent.c.step_name, recent.c.started_at, recent.c.completed_at)
        .join(workflows, workflows.c.id == recent.c.workflow_id)
        .where(recent.c.step_name.in_(sorted({step for _cls, step in wanted})))
    )
    samples: dict[StepKey, list[float]] = {}
    for cls, step, started, completed in rows:
        if (cls, step) in wanted and started is not None and completed is not None:
            samples.setdefault((cls, step), []).append((completed - started).total_seconds())
    return {
        key: timedelta(seconds=percentile(values, RUNNING_LONG_PERCENTILE))
        for key, values in samples.items()
        if len(values) >= HISTORY_MIN_SAMPLES
    }


def is_running_long(execution: StepExecution, usual: timedelta | None, now: datetime) -> bool:
    """In progress past :func:`running_long_after` its step's ``usual`` duration (None: no
    history, never flagged here)."""
    if execution.state != StepState.IN_PROGRESS or usual is None:
        return False
    started = execution.started_at
    return started is not None and now - started > running_long_after(usual)
