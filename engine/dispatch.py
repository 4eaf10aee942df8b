"""The dispatcher: hands due step executions to the transport (SPEC §1.2).

The step-execution row is the schedule. Executions due within ``settings.dispatch_horizon``
are sent when the transaction that creates them commits; everything due later is left unsent
(``sent_at`` NULL), because long Celery ETAs sit in worker memory and are redelivered by Redis
visibility timeouts. The dispatcher wakes every ``settings.dispatch_interval``, selects the
``scheduled`` executions of ``ready`` workflows that are due and were never sent, or were sent
more than ``settings.dispatch_resend_after`` ago and still have not started, marks them sent
(``sent_at``, a new ``job_id``) and sends them after its own commit.

The resend rule makes the dispatcher the backstop for messages lost between a commit and its
send (a crash, a broker blip): sending is at-least-once, and running stays exactly-once per
row because the executor only starts an execution that is still ``scheduled``, under the
workflow lock. On PostgreSQL the claim uses ``FOR UPDATE … SKIP LOCKED``, so several
dispatchers (or several beat-driven tasks) can run at once without sending a row twice per
interval; on SQLite the claim runs under the database write lock (``BEGIN IMMEDIATE``).

Entry points: :func:`dispatch_due` (one sweep; the Celery beat task calls it) and
:func:`run_dispatcher` (a plain loop that also runs housekeeping; ``geneva-drive dispatcher``).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from geneva_drive import db, scheduling
from geneva_drive.config import settings
from geneva_drive.housekeeping import run as run_housekeeping
from geneva_drive.instrumentation import ContextAdapter, report_error
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import StepState, WorkflowState
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

#: Rows claimed per transaction; a sweep loops over batches until one comes back short.
DISPATCH_BATCH_SIZE = 500


def dispatch_due(now: datetime | None = None, *, batch_size: int = DISPATCH_BATCH_SIZE) -> int:
    """Send every due, unsent (or long-unstarted) execution; return how many were sent.

    Each batch is its own short transaction, so a large backlog never holds the lock for long,
    and messages of a batch leave right after that batch commits.
    """
    moment = now or utcnow()
    total = 0
    while True:
        sent = _dispatch_batch(moment, batch_size)
        total += sent
        if sent < batch_size:
            break
    if total:
        log.info("dispatched %d due step execution(s)", total)
    return total


def _due_query(now: datetime, batch_size: int, session: Session) -> Select[StepExecution, Workflow]:
    resend_cutoff = now - settings.dispatch_resend_after
    query = (
        select(StepExecution, Workflow)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state == StepState.SCHEDULED,
            StepExecution.scheduled_for <= now,
            Workflow.state == WorkflowState.READY,
            or_(StepExecution.sent_at.is_(None), StepExecution.sent_at < resend_cutoff),
        )
        # The (state, scheduled_for) index serves this order; the oldest due work goes first.
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(batch_size)
    )
    if not db.is_sqlite(session):
        # MariaDB has no ``FOR UPDATE OF``: SQLAlchemy leaves it out there, so the claim also
        # locks the joined workflow rows, and one held by an executor or an operator right now
        # is skipped this sweep like a claimed execution (picked up by the next one).
        query = query.with_for_update(skip_locked=True, of=StepExecution)
    return query


def _dispatch_batch(now: datetime, batch_size: int) -> int:
    session = db.new_session()
    try:
        db.begin_write(session)
        rows = session.execute(_due_query(now, batch_size, session)).all()
        for row in rows:
            execution, workflow = row[0], row[1]
            _claim(session, workflow, execution, now)
        session.commit()  # the after-commit hook sends the queued messages
        return len(rows)
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _claim(session: Session, workflow: Workflow, execution: StepExecution, now: datetime) -> None:
    context = ContextAdapter(
        log,
        {
            "workflow": type(workflow).__name__,
            "workflow_id": workflow.id,
            "execution_id": execution.id,
            "step": execution.step_name,
        },
    )
    try:
        scheduling.enqueue_execution(
            session, workflow, execution, workflow.steps.named(execution.step_name), force=True
        )
        context.debug("sent (scheduled for %s)", execution.scheduled_for.isoformat())
    except Exception as error:
        # A row that cannot be sent (say, job options a newer deploy rejects) must not stop the
        # sweep; it is tried again after dispatch_resend_after, and reported each time.
        context.error("could not send: %s", error)
        report_error(
            error,
            {
                "workflow_id": workflow.id,
                "workflow_class": type(workflow).__name__,
                "step_execution_id": execution.id,
                "step_name": execution.step_name,
            },
        )
    # Stamp with the sweep's own clock: a row is then never picked twice in one sweep, even when
    # ``now`` was passed in (tests, catch-up runs) and differs from the wall clock. A row a job
    # option holds beyond the horizon (wait_until ahead) moved its scheduled_for instead and
    # stays unsent, to be found when that time comes.
    if execution.scheduled_for <= now:
        execution.sent_at = now


def run_dispatcher(
    stop_event: threading.Event,
    *,
    interval: float | None = None,
    housekeeping: bool = True,
    dispatch: bool = True,
    first_housekeeping_after: float = 0.0,
) -> None:
    """Dispatch every ``interval`` seconds (default ``settings.dispatch_interval``) until stopped.

    Also runs :func:`geneva_drive.housekeeping.run` every ``settings.housekeeping_interval`` when
    ``housekeeping`` is true. ``dispatch=False`` runs housekeeping alone (the embedded worker
    reads due executions from the table itself, so it needs no sends);
    ``first_housekeeping_after`` seconds delay the first housekeeping run. Errors are reported
    and the loop carries on: a database restart must not need a dispatcher restart.
    """
    next_housekeeping = time.monotonic() + first_housekeeping_after
    log.info("dispatcher started")
    while not stop_event.is_set():
        started = time.monotonic()
        if dispatch:
            try:
                dispatch_due()
            except Exception as error:
                log.exception("dispatch sweep failed; retrying next interval")
                report_error(error, {"component": "dispatcher"})
        if housekeeping and time.monotonic() >= next_housekeeping:
            try:
                run_housekeeping()
            except Exception as error:
                log.exception("housekeeping failed; retrying next interval")
                report_error(error, {"component": "housekeeping"})
            next_housekeeping = time.monotonic() + settings.housekeeping_interval.total_seconds()
        period = interval if interval is not None else settings.dispatch_interval.total_seconds()
        # Sweeps start every ``period`` seconds: the sweep's own time is not added to the
        # period, so a due execution waits at most one period plus the sweep that sends it.
        stop_event.wait(max(0.0, period - (time.monotonic() - started)))
    log.info("dispatcher stopped")
