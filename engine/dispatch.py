"""The dispatcher: hands due step executions to the transport (docs/MANUAL.md, "Scheduling").

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

The same sweep fires the time-outs of parked executions whose deadline passed
(:func:`fire_timeouts`; the rules are engine/timeouts.py's), so a deployment fires each within
one dispatch interval; the embedded worker, which sends nothing, still runs this part.

Every sweep also recovers the executions of workers whose lease expired
(:func:`geneva_drive.liveness.recover_expired`), so a killed worker's steps run again within
``worker_lease`` plus one interval, and fires the due schedules (engine/schedules.py).

Entry points: :func:`dispatch_due` (one sweep) and :func:`run_dispatcher` (the loop, with
housekeeping in a thread beside it), which ``geneva-drive dispatcher``, ``geneva-drive up`` and
Celery beat run in-process: the sweeps never travel as messages, so a backlog of step messages
cannot hold them up (docs/MANUAL.md, "When a worker dies").
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, or_, select, tuple_
from sqlalchemy.orm import Session

from geneva_drive import db, liveness, schedules, scheduling, timeouts, tracing, transitions
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.housekeeping import run as run_housekeeping
from geneva_drive.instrumentation import ContextAdapter, log_context, report_context, report_error
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.registry import registered_workflows
from geneva_drive.states import StepState, WorkflowState
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

#: Rows claimed per transaction; a sweep loops over batches until one comes back short.
DISPATCH_BATCH_SIZE = 500


def dispatch_due(now: datetime | None = None, *, batch_size: int = DISPATCH_BATCH_SIZE) -> int:
    """Send every due, unsent (or long-unstarted) execution; return how many were sent.

    Each batch is its own short transaction, so a large backlog never holds the lock for long,
    and messages of a batch leave right after that batch commits.

    With tracing on, the sweep is a ``geneva_drive.dispatch`` span of its own; each message it
    sends is published in its workflow's trace (docs/MANUAL.md, "Tracing").
    """
    with tracing.operation("geneva_drive.dispatch") as span:
        moment = now or utcnow()
        fire_timeouts(moment, batch_size=batch_size)
        recover_dead_workers()  # by the heartbeats' own clock, whatever ``now`` says
        fire_schedules(moment)
        total = 0
        after: tuple[datetime, int] | None = None
        while True:
            sent, after = _dispatch_batch(moment, batch_size, after)
            total += sent
            if sent < batch_size:
                break
        if total:
            log.info("dispatched %d due step execution(s)", total)
        if span is not None:
            span.set_attribute("geneva_drive.dispatched", total)
        return total


def _due_query(
    now: datetime, batch_size: int, session: Session, after: tuple[datetime, int] | None = None
) -> Select[StepExecution, Workflow]:
    """The next batch of due work, oldest first, after ``after`` (the previous batch's last
    ``(scheduled_for, id)`` in this sweep).

    The keyset makes a sweep linear in what it sends: each batch starts where the last one
    stopped instead of walking again past the rows this sweep already claimed (they stay
    ``scheduled`` until a worker starts them) or passed over (a paused workflow, a row another
    dispatcher holds: the next sweep looks at those again).
    """
    resend_cutoff = now - settings.dispatch_resend_after
    # A row with a job id and no sent_at is an inline successor its worker is about to claim
    # (engine/inline.py): sending it in that gap would put a duplicate message on the broker.
    # Once it is a dispatch_interval old, its worker is taken to have died: it is sent.
    held_cutoff = now - settings.dispatch_interval
    query = (
        select(StepExecution, Workflow)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state == StepState.SCHEDULED,
            StepExecution.scheduled_for <= now,
            Workflow.state == WorkflowState.READY,
            or_(
                and_(
                    StepExecution.sent_at.is_(None),
                    or_(StepExecution.job_id.is_(None), StepExecution.created_at < held_cutoff),
                ),
                StepExecution.sent_at < resend_cutoff,
            ),
        )
        # The partial (scheduled_for, id) index of scheduled rows serves this order with no
        # sort, equal timestamps included; the oldest due work goes first.
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .limit(batch_size)
    )
    if after is not None:
        # A row-value comparison: an index range on both columns (PostgreSQL, SQLite), so
        # rows at the same instant before ``after`` are not read again.
        query = query.where(tuple_(StepExecution.scheduled_for, StepExecution.id) > tuple_(*after))
    # MariaDB has no ``FOR UPDATE OF``: SQLAlchemy leaves it out there, so the claim also
    # locks the joined workflow rows, and one held by an executor or an operator right now
    # is skipped this sweep like a claimed execution (picked up by the next one).
    query = dialect_for(session).lock(query, skip_locked=True, of=StepExecution)
    return query


def _dispatch_batch(
    now: datetime, batch_size: int, after: tuple[datetime, int] | None
) -> tuple[int, tuple[datetime, int] | None]:
    """Claim and send one batch; return its size and where the next batch starts."""
    session = db.new_session()
    try:
        db.begin_write(session)
        rows = session.execute(_due_query(now, batch_size, session, after)).all()
        if rows:
            # Read before claiming: a claim may move scheduled_for (a wait_until ahead).
            last = rows[-1][0]
            after = (last.scheduled_for, last.id)
        for row in rows:
            execution, workflow = row[0], row[1]
            _claim(session, workflow, execution, now)
        session.commit()  # the after-commit hook sends the queued messages
        return len(rows), after
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def _claim(session: Session, workflow: Workflow, execution: StepExecution, now: datetime) -> None:
    context = ContextAdapter(log, log_context(workflow, execution))
    try:
        scheduling.enqueue_execution(
            session, workflow, execution, workflow.steps.named(execution.step_name), force=True
        )
        context.debug("sent (scheduled for %s)", execution.scheduled_for.isoformat())
    except Exception as error:
        # A row that cannot be sent (say, job options a newer deploy rejects) must not stop the
        # sweep; it is tried again after dispatch_resend_after, and reported each time.
        context.error("could not send: %s", error)
        report_error(error, report_context(workflow, execution))
    # Stamp with the sweep's own clock: a row is then never picked twice in one sweep, even when
    # ``now`` was passed in (tests, catch-up runs) and differs from the wall clock. A row a job
    # option holds beyond the horizon (wait_until ahead) moved its scheduled_for instead and
    # stays unsent, to be found when that time comes.
    if execution.scheduled_for <= now:
        execution.sent_at = now


def fire_schedules(now: datetime | None = None) -> int:
    """The sweep's schedules part (engine/schedules.py): one workflow per due tick. Guarded
    like the liveness part; returns how many workflows it created."""
    try:
        return schedules.fire_due(now).created
    except Exception as error:
        log.exception("firing the due schedules failed")
        report_error(error, {"component": "schedules"})
        return 0


def recover_dead_workers(now: datetime | None = None) -> int:
    """The sweep's liveness part (engine/liveness.py): recover the executions of workers whose
    lease expired. Guarded: a failure is reported and leaves the rest of the sweep running."""
    try:
        return liveness.recover_expired(None, now)
    except Exception as error:
        log.exception("recovering the executions of expired workers failed")
        report_error(error, {"component": "liveness"})
        return 0


# --- time-outs of parked executions ------------------------------------------------------------


def fire_timeouts(now: datetime | None = None, *, batch_size: int = DISPATCH_BATCH_SIZE) -> int:
    """Fire every time-out whose deadline is ``<= now``; return how many fired.

    Part of :func:`dispatch_due`; called alone by the embedded worker's loop. First gives a
    deadline to executions parked before a deploy added ``timeout=`` to their step
    (:func:`adopt_parked`). Each batch is its own short transaction.
    """
    moment = now or utcnow()
    adopt_parked(moment, batch_size=batch_size)
    if not _any_timeout_due(moment):
        return 0  # the common case: no write lock taken (SQLite), one index probe
    fired = 0
    while True:
        found, handled, batch_fired = _timeout_batch(moment, batch_size)
        fired += batch_fired
        # Stop when the backlog is exhausted, or when nothing in a full batch could be handled
        # (every workflow held by someone else right now: the next sweep takes them).
        if found < batch_size or handled == 0:
            break
    if fired:
        log.info("fired %d wait time-out(s)", fired)
    return fired


def _any_timeout_due(now: datetime) -> bool:
    with db.new_session() as session:
        due = session.scalar(
            select(StepExecution.id)
            .where(StepExecution.state == StepState.WAITING, StepExecution.timeout_at <= now)
            .limit(1)
        )
    return due is not None


def _timeout_batch(now: datetime, batch_size: int) -> tuple[int, int, int]:
    """One transaction: (parked executions found past their deadline, handled, fired)."""
    session = db.new_session()
    try:
        db.begin_write(session)
        # The partial index on timeout_at (state = 'waiting') serves this, soonest first.
        due = session.execute(
            select(StepExecution.workflow_id)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.state == StepState.WAITING,
                StepExecution.timeout_at <= now,
                Workflow.state == WorkflowState.READY,
            )
            .order_by(StepExecution.timeout_at, StepExecution.id)
            .limit(batch_size)
        ).all()
        if not due:
            session.commit()
            return 0, 0, 0
        # Lock the workflows first, as every other writer of a parked execution does (the
        # executor, signal delivery, operators): the same order, so no deadlock. A workflow
        # locked elsewhere right now is skipped (SKIP LOCKED) and its execution rechecked by
        # the next sweep; timeouts.fire_due rechecks everything under the lock anyway.
        lock = (
            select(Workflow)
            .where(Workflow.id.in_(sorted({row[0] for row in due})))
            .order_by(Workflow.id)
        )
        lock = dialect_for(session).lock(lock, skip_locked=True)
        handled = fired = 0
        for workflow in session.scalars(lock).all():
            handled += 1
            try:
                with session.begin_nested():
                    fired += timeouts.fire_due(session, workflow, now)
            except Exception as error:
                # One workflow whose action fails (say, its next step's job options) must not
                # stop the others; it is found again by the next sweep, and reported each time.
                log.exception("time-out of workflow %s could not fire", workflow.id)
                report_error(error, {"workflow_id": workflow.id, "component": "timeouts"})
        session.commit()  # the after-commit hook sends the woken ("run") executions
        return len(due), handled, fired
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


#: What adopt_parked last adopted: (database, the timed steps of the registry, monotonic time).
_adopted: dict[str, Any] = {}
#: How often the adoption looks again with unchanged definitions: a worker still running the
#: old code during a rolling deploy may park executions without a deadline after it ran.
ADOPT_AGAIN_AFTER = timedelta(minutes=10)


def adopt_parked(now: datetime, *, batch_size: int = DISPATCH_BATCH_SIZE) -> int:
    """Start the clock of executions parked before their step had ``timeout=``.

    A deploy that adds ``timeout=`` to a step finds executions parked on it with no deadline.
    Their clock starts at the first sweep of the new code: ``timeout_at = now + timeout``.
    Never earlier (from ``waiting_since``): a deploy must not fire a mass of time-outs by
    itself, canceling orders that were waiting under rules that had no deadline (docs/
    MANUAL.md, "Time-bounded waits"). Runs when the registered definitions (or the database)
    change, and again every ``ADOPT_AGAIN_AFTER``; returns how many executions it adopted.
    """
    timed = {
        (name, step.name): step.timeout
        for name, cls in registered_workflows().items()
        for step in cls.steps
        if step.timeout is not None
    }
    if not timed:
        return 0
    engine = db.get_engine()
    key = (str(engine.url), id(engine), frozenset(timed.items()))
    last = _adopted.get("key")
    if last == key and now - _adopted["at"] < ADOPT_AGAIN_AFTER:
        return 0
    adopted = 0
    while True:
        count, found = _adopt_batch(now, timed, batch_size)
        adopted += count
        if found < batch_size:
            break
    _adopted.update(key=key, at=now)
    if adopted:
        log.info("started the time-out clock of %d execution(s) parked before it existed", adopted)
    return adopted


def _adopt_batch(
    now: datetime, timed: dict[tuple[str, str], timedelta], batch_size: int
) -> tuple[int, int]:
    session = db.new_session()
    try:
        db.begin_write(session)
        rows = session.execute(
            select(StepExecution, Workflow.type)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.state == StepState.WAITING,
                StepExecution.timeout_at.is_(None),
                or_(
                    *(
                        and_(Workflow.type == name, StepExecution.step_name == step)
                        for name, step in sorted(timed)
                    )
                ),
            )
            .order_by(StepExecution.id)
            .limit(batch_size)
        ).all()
        for execution, workflow_type in rows:
            # No workflow lock: only the deadline is written (by primary key). A signal
            # waking the execution meanwhile leaves a deadline on a row no sweep looks at.
            transitions.arm_timeout(execution, now + timed[(workflow_type, execution.step_name)])
        session.commit()
        return len(rows), len(rows)
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


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
    ``housekeeping`` is true, in a thread of its own: a long housekeeping run (a large cleanup)
    never holds up a sweep, so time-outs and the recovery of expired workers stay on time.
    ``dispatch=False`` runs the time-outs and the liveness recovery alone (the embedded worker
    reads due executions from the table itself, so it needs no sends); ``first_housekeeping_after``
    seconds delay the first housekeeping run. Errors are reported and the loops carry on: a
    database restart must not need a dispatcher restart.
    """
    keeper: threading.Thread | None = None
    if housekeeping:
        keeper = threading.Thread(
            target=_housekeeping_loop,
            args=(stop_event, first_housekeeping_after),
            name="geneva-housekeeping",
            daemon=True,
        )
        keeper.start()
    try:
        # The code's schedules to their rows now, so the first sweep already fires them.
        schedules.reconcile(force=True)
    except Exception as error:
        log.exception("writing the code's schedules failed; the sweeps try again")
        report_error(error, {"component": "schedules"})
    log.info("dispatcher started")
    while not stop_event.is_set():
        started = time.monotonic()
        try:
            if dispatch:
                dispatch_due()
            else:
                fire_timeouts()
                recover_dead_workers()
                fire_schedules()
        except Exception as error:
            log.exception("dispatch sweep failed; retrying next interval")
            report_error(error, {"component": "dispatcher"})
        period = interval if interval is not None else settings.dispatch_interval.total_seconds()
        # Sweeps start every ``period`` seconds: the sweep's own time is not added to the
        # period, so a due execution waits at most one period plus the sweep that sends it.
        stop_event.wait(max(0.0, period - (time.monotonic() - started)))
    if keeper is not None:
        keeper.join(5.0)
    log.info("dispatcher stopped")


def _housekeeping_loop(stop_event: threading.Event, first_after: float) -> None:
    if stop_event.wait(max(0.0, first_after)):
        return
    while not stop_event.is_set():
        started = time.monotonic()
        try:
            run_housekeeping()
        except Exception as error:
            log.exception("housekeeping failed; retrying next interval")
            report_error(error, {"component": "housekeeping"})
        period = settings.housekeeping_interval.total_seconds()
        stop_event.wait(max(0.0, period - (time.monotonic() - started)))


def start_dispatcher_thread(stop_event: threading.Event | None = None) -> threading.Event:
    """Run :func:`run_dispatcher` (sweeps and housekeeping) in daemon threads of this process
    (Celery beat does); returns the event that stops them."""
    event = stop_event or threading.Event()
    threading.Thread(
        target=run_dispatcher, args=(event,), name="geneva-dispatcher", daemon=True
    ).start()
    return event
