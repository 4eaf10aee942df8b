"""Housekeeping: cleanup of old workflows, recovery of stuck executions, gauges
(docs/MANUAL.md, "Housekeeping").

One :func:`run` does, in the gem's order:

1. **Cleanup** of finished/canceled workflows whose ``transitioned_at`` is older than
   ``settings.delete_completed_workflows_after`` (None disables it). The old workflows are
   walked once in id order, in slices of ``housekeeping_batch_size`` workflows (fewer when
   their rows, executions and signals included, would pass five times that); each slice's
   executions, signals and workflows go in one short transaction. Ongoing workflows are never
   deleted, whatever their age.
2. **Expired workers**: the recovery every dispatcher sweep runs (engine/liveness.py), and the
   pruning of rows of workers gone for over a day.
3. **Stuck in_progress** recovery: ``started_at`` older than ``stuck_in_progress_threshold`` and
   no worker recorded (engine/lateness.py), oldest first.
4. **Stuck scheduled** recovery: overdue past ``stuck_scheduled_threshold`` and its message never
   sent or sent longer ago than that (a message that never arrived and was not resent), in
   ``(state, scheduled_for)`` order. ``waiting`` executions are never touched: waiting for a
   signal for months is legitimate.
5. **Stranded waiting** executions: a step parked for a signal whose step the deployed code
   no longer runs (docs/MANUAL.md,
   "A step deleted under parked executions"). Its step is not defined: the execution fails with
   ``StepNotDefinedError`` and the workflow is paused, exactly as the executor does for a
   scheduled one, so it shows on Stranded and ``resume_at`` applies (its signals stay
   buffered). Its step is a ``removed_step``: it is skipped and the next step scheduled. Its
   step no longer waits for a signal: it is sent to run. Only registered classes are judged
   (a process that did not import a class must not pause its workflows).
6. **Rollup** of the executions that finished in each settled minute, for the charts and the
   failures page (:mod:`geneva_drive.rollups`).
7. **Gauges** through :mod:`geneva_drive.metrics_facade`.

Recovery itself lives in engine/recovery.py (shared with the liveness sweep): it locks the
workflow, then the execution (both re-read), asks again whether the row is still stuck, and
applies ``stuck_recovery_action``.

Runs never overlap: :func:`run` holds the ``housekeeping`` lease (engine/liveness.py
``hold_lease``) and returns at once when another run holds it.

Two deliberate refinements over the gem, both about workflows an operator already moved: the
stuck-scheduled sweep leaves *paused* workflows alone (``pause()`` keeps the scheduled
execution on purpose, for ``resume()`` to send), and an execution of a finished/canceled
workflow is only closed (canceled/recovered), never rescheduled. A stuck in_progress
execution of a paused workflow is closed without scheduling another one; ``resume()`` then
retries the step.

Every row is recovered in its own transaction. A row whose recovery raises is logged,
reported through :func:`geneva_drive.instrumentation.report_error`, left as it was, and excluded
for the rest of the run, so a poisoned row can never make the sweep loop forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    Column,
    ColumnElement,
    CursorResult,
    Table,
    and_,
    delete,
    func,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.orm import Session

from geneva_drive import (
    archive,
    counts,
    db,
    lateness,
    liveness,
    metrics,
    recovery,
    registry,
    rollups,
    signals,
    tracing,
    transitions,
)
from geneva_drive.config import settings
from geneva_drive.dialects import Dialect, dialect_for
from geneva_drive.explain import STEP_NOT_DEFINED
from geneva_drive.instrumentation import (
    ContextAdapter,
    housekeeping_performed,
    report_error,
)
from geneva_drive.lateness import is_stuck
from geneva_drive.models import (
    TERMINAL_WORKFLOW_PREDICATE,
    Signal,
    StepExecution,
    utcnow,
)
from geneva_drive.states import (
    StepState,
    WorkflowState,
)
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

_workflows: Table = Workflow.__table__  # type: ignore[assignment]
_executions: Table = StepExecution.__table__  # type: ignore[assignment]
_signals: Table = Signal.__table__  # type: ignore[assignment]


@dataclass
class HousekeepingReport:
    """What one run did; the keys are the gem's result keys."""

    workflows_cleaned_up: int = 0
    step_executions_cleaned_up: int = 0
    signals_cleaned_up: int = 0
    stuck_in_progress_recovered: int = 0
    stuck_scheduled_recovered: int = 0
    #: Waiting executions whose step the code no longer runs (paused, skipped or sent).
    stranded_waiting_released: int = 0
    #: In-progress executions of workers whose lease expired (engine/liveness.py).
    worker_recoveries: int = 0
    #: 1 when this run found another housekeeping run in progress and did nothing.
    skipped_overlapping: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __getitem__(self, key: str) -> int:
        """``report["workflows_cleaned_up"]``, like the gem's result hash."""
        return self.as_dict()[key]


#: The lease that keeps two housekeeping runs from overlapping (two beats, a beat and a
#: ``geneva-drive dispatcher``): a run that finds it held does nothing.
LEASE_NAME = "housekeeping"
#: How soon the lease of a run that was killed mid-way lapses (it is renewed every third of it).
LEASE_DURATION = timedelta(seconds=60)


def run(now: datetime | None = None) -> HousekeepingReport:
    """One housekeeping pass; see the module docstring. Returns the counts.

    Runs only while no other housekeeping run holds its lease (:data:`LEASE_NAME`); otherwise
    returns at once with ``skipped_overlapping`` set. The lease is renewed while the run goes
    on; a run killed mid-way lets it lapse within :data:`LEASE_DURATION`.
    """
    with (
        tracing.operation("geneva_drive.housekeeping") as span,
        liveness.hold_lease(LEASE_NAME, LEASE_DURATION) as held,
    ):
        if not held:
            log.info("another housekeeping run is in progress; skipping this one")
            report = HousekeepingReport(skipped_overlapping=1)
        else:
            report = _run(now)
        if span is not None:
            # The span of its own (docs/MANUAL.md, "Tracing") carries what the run did.
            for key, value in report.as_dict().items():
                span.set_attribute(f"geneva_drive.housekeeping.{key}", value)
        return report


def _run(now: datetime | None) -> HousekeepingReport:
    moment = now or utcnow()
    report = HousekeepingReport()
    _guarded("cleanup", lambda: cleanup(moment, report))

    def workers() -> None:
        # Leases are judged by the clock the heartbeats are written with, never by a ``now``
        # handed in (a catch-up run, a test's "a month later" would expire every live worker).
        report.worker_recoveries = liveness.recover_expired()
        liveness.prune()

    _guarded("expired workers' recovery", workers)

    def in_progress() -> None:
        report.stuck_in_progress_recovered = recover_stuck(StepState.IN_PROGRESS, moment)

    def scheduled() -> None:
        report.stuck_scheduled_recovered = recover_stuck(StepState.SCHEDULED, moment)

    _guarded("stuck in_progress recovery", in_progress)
    _guarded("stuck scheduled recovery", scheduled)

    def stranded() -> None:
        report.stranded_waiting_released = release_stranded_waiting()

    _guarded("stranded waiting", stranded)

    def rollup() -> None:
        rollups.roll_up(moment)

    _guarded("execution minutes rollup", rollup)
    _guarded("gauges", lambda: report_gauges(moment))
    log.info("Completed: %s", report.as_dict())
    if housekeeping_performed.receivers:
        housekeeping_performed.send("engine", report=report)
    return report


def _guarded(phase: str, fn: Callable[[], None]) -> None:
    # One broken phase (a lock timeout while deleting, say) must not stop recovery or gauges.
    try:
        fn()
    except Exception as error:
        log.exception("housekeeping %s failed", phase)
        report_error(error, {"component": "housekeeping", "phase": phase})


# --- 1. cleanup --------------------------------------------------------------------------------

#: A cleanup slice holds up to ``housekeeping_batch_size`` workflows and at most this many times
#: as many rows in all. 2026-11-29 (B7): a transaction has a fixed cost (round trips,
#: commit) of several milliseconds, so slices of 1,000 rows reached only ~21k rows/s on
#: PostgreSQL with B7's concurrent hops; 1,000 typical workflows (3-4 rows each) delete in about
#: 40 ms (~90k rows/s), and the cap keeps a slice of workflows with long histories near 5,000
#: rows, under B7's 150 ms per transaction.
CLEANUP_ROWS_PER_WORKFLOW = 5


def cleanup(now: datetime, report: HousekeepingReport) -> None:
    """Delete old finished/canceled workflows with their executions and signals, in slices.

    The old workflows are walked once, oldest first, by keyset on ``(transitioned_at, id)``
    through the partial index of finished/canceled workflows on those columns, so a pass reads
    only the rows it deletes (with nothing to delete: an empty index range). A slice is the
    next ``housekeeping_batch_size`` of them, cut short once their rows (each workflow, its
    executions and its signals) would pass ``CLEANUP_ROWS_PER_WORKFLOW`` times that; one
    workflow bigger than the cap is a slice alone. Each slice is one short transaction. The
    keyset moves past every slice whatever it deleted, so the loop ends after one pass.
    """
    threshold = settings.delete_completed_workflows_after
    if threshold is None:
        log.info("cleanup disabled (delete_completed_workflows_after is None)")
        return
    cutoff = now - threshold
    batch = max(1, settings.housekeeping_batch_size)
    if settings.archive_completed_workflows_to is not None:
        # Kept first (written, verified, then deleted). A workflow the archive left in place
        # (it changed while it was written) waits for a later run: never deleted unwritten.
        written = archive.archive(
            threshold, Path(settings.archive_completed_workflows_to), now=now, batch=batch
        )
        report.workflows_cleaned_up += written.workflows
        report.step_executions_cleaned_up += written.step_executions
        report.signals_cleaned_up += written.signals
        return
    after: Keyset | None = None
    while True:
        last = _cleanup_slice(cutoff, after, batch, report)
        if last is None:
            return
        after = last


#: A cleanup position: the ``(transitioned_at, id)`` of the last workflow a slice passed.
Keyset = tuple[datetime, int]


def _old(cutoff: datetime, dialect: Dialect | None = None) -> ColumnElement[bool]:
    predicate = TERMINAL_WORKFLOW_PREDICATE
    if dialect is not None:
        # SQLite's (transitioned_at, id) index is a full one: without statistics its planner
        # takes the (state, id) index for any state term and sorts every finished workflow.
        # Its dialect keeps the state test off every index (a unary +); the range then comes
        # from the time index, ongoing workflows that old (few: the live set) filtered out.
        predicate = dialect.off_index_predicate(predicate)
    # Elsewhere the partial index's own predicate as a literal, which the planner matches to it.
    return and_(text(predicate), _workflows.c.transitioned_at < cutoff)


def _past(after: Keyset | None) -> ColumnElement[bool]:
    if after is None:
        return true()
    # A row-value comparison: one index range on both columns (PostgreSQL, SQLite).
    return tuple_(_workflows.c.transitioned_at, _workflows.c.id) > tuple_(*after)


def _rows_of_workflow() -> ColumnElement[int]:
    """The rows deleting one workflow removes: itself, its executions and its signals."""
    executions = (
        select(func.count()).where(_executions.c.workflow_id == _workflows.c.id).scalar_subquery()
    )
    signals = (
        select(func.count()).where(_signals.c.workflow_id == _workflows.c.id).scalar_subquery()
    )
    return 1 + executions + signals


def _cleanup_slice(
    cutoff: datetime, after: Keyset | None, batch: int, report: HousekeepingReport
) -> Keyset | None:
    """Delete one slice of old workflows past ``after``; return the slice's last position.

    Returns None when no old workflow is left past ``after``. The report counts only what a
    committed transaction deleted.
    """
    # Committed as the with block ends (db.transaction), before the report counts it.
    with db.transaction() as session:
        db.begin_write(session)
        dialect = dialect_for(session)
        order = (_workflows.c.transitioned_at, _workflows.c.id)
        query = (
            select(_workflows.c.id, _workflows.c.transitioned_at, _rows_of_workflow())
            .where(_past(after), _old(cutoff, dialect))
            .order_by(*order)
            .limit(batch)
        )
        # Past the slice's last candidate, where the next slice starts (None: nothing left).
        last: Keyset | None = None
        if dialect.lock_candidates_first():
            # InnoDB locks every row its scan reads before it tests the WHERE clause, so a
            # locking version of the scan queues behind any locked workflow in id order - an
            # ongoing one an executor holds included - until a lock wait timeout.
            # The candidates come from a plain (non-locking) read instead; only they are
            # locked, by primary key, and the condition is tested again under the lock, on the
            # newest committed version (as PostgreSQL does below).
            plain = session.execute(query.with_only_columns(*order)).all()
            if not plain:
                return None
            last = (plain[-1][0], plain[-1][1])
            ids = [row[1] for row in plain]
            # Locked through the primary key in id order, as before the time-ordered keyset:
            # a locking read through the (state, transitioned_at) index would also lock
            # that index's entries, which a writer changing a workflow's state must take
            # (a deadlock, measured). The slice's time order is restored below.
            query = (
                select(_workflows.c.id, _workflows.c.transitioned_at, _rows_of_workflow())
                .where(_workflows.c.id.in_(ids), _old(cutoff))
                .order_by(_workflows.c.id)
            )
            query = dialect.primary_key_only(query, _workflows)
        if dialect.row_locks:
            # 2026-11-29, the rows are locked in id order and the "old and
            # finished/canceled" test holds under the lock: PostgreSQL evaluates the WHERE
            # clause again on the newest row version of a row it had to wait for. A plain
            # FOR UPDATE, not SKIP LOCKED: a workflow a signal or an operator holds for a
            # moment is waited for and then deleted (skipping it left it behind for good, as
            # the keyset never comes back), while one whose state moved on meanwhile is kept.
            # Two housekeepers lock in the same order; the second waits at most one slice.
            # (The counting subqueries take no locks: a locking clause applies to its own
            # query block only, on every backend.)
            query = query.with_for_update(of=_workflows)
        # A lost cleanup commit (a crash of the database server within its WAL writer
        # delay) only leaves rows for the next run to delete; not waiting for the flush
        # saves a few ms per slice and the workers' commits a queue at the WAL.
        dialect.relax_durability(session)
        rows = sorted(session.execute(query).all(), key=lambda row: (row[1], row[0]))
        if not rows:
            return last  # MariaDB: every candidate moved on meanwhile; go past them
        candidates = [(workflow_id, size) for workflow_id, _at, size in rows]
        chosen = _fill(candidates, batch * CLEANUP_ROWS_PER_WORKFLOW)
        counts = _delete_workflows(session, chosen, dialect)
        if len(chosen) < len(candidates) or last is None:
            at = rows[len(chosen) - 1][1]
            last = (at, chosen[-1])
    report.step_executions_cleaned_up += counts[0]
    report.signals_cleaned_up += counts[1]
    report.workflows_cleaned_up += counts[2]
    return last


def _fill(candidates: Sequence[tuple[int, int]], budget: int) -> list[int]:
    """The longest prefix of ``candidates`` whose rows fit in ``budget`` (at least one)."""
    chosen: list[int] = []
    rows = 0
    for workflow_id, size in candidates:
        if chosen and rows + size > budget:
            break
        chosen.append(workflow_id)
        rows += size
    return chosen


def _delete_workflows(session: Session, ids: list[int], dialect: Dialect) -> tuple[int, int, int]:
    # Children first, so the cascade from each workflow finds nothing left to do. The
    # workflows stay locked meanwhile, so no execution or signal can be added to them.
    def deleted(table: Table, column: Column[int]) -> int:
        # PostgreSQL: one array parameter instead of an IN list of thousands (its dialect).
        result = session.execute(delete(table).where(dialect.id_in(column, ids)))
        return cast("CursorResult[Any]", result).rowcount

    counts.forget_workflows(session, ids)

    return (
        deleted(_executions, _executions.c.workflow_id),
        deleted(_signals, _signals.c.workflow_id),
        deleted(_workflows, _workflows.c.id),
    )


# --- 2./3. stuck recovery ----------------------------------------------------------------------


def recover_stuck(state: str, now: datetime) -> int:
    """Recover every stuck execution in ``state`` (in_progress or scheduled); return the count."""
    excluded: set[int] = set()
    recovered = 0
    # Executions this run creates (the retries) are never candidates in the same run, whatever
    # clock ``now`` says: the sweep only looks at rows that existed when it started.
    with db.new_session() as session:
        newest = session.scalar(select(func.max(StepExecution.id))) or 0
    while True:
        ids = _stuck_ids(state, now, excluded, newest)
        if not ids:
            return recovered
        for execution_id in ids:
            try:
                done = recover_execution(execution_id, now)
            except Exception as error:
                excluded.add(execution_id)
                log.error("Failed to recover step execution %s: %s", execution_id, error)
                report_error(
                    error, {"component": "housekeeping", "step_execution_id": execution_id}
                )
                continue
            if done:
                recovered += 1
            else:
                # Skipped (locked elsewhere, or already moved on): look again next run.
                excluded.add(execution_id)


def _stuck_ids(state: str, now: datetime, excluded: set[int], newest: int) -> list[int]:
    batch = settings.housekeeping_batch_size
    if state == StepState.IN_PROGRESS:
        column = StepExecution.started_at
        stuck = lateness.stuck_in_progress_condition(now)
    else:
        column = StepExecution.scheduled_for
        stuck = lateness.stuck_scheduled_condition(now)
    query = select(StepExecution.id).where(stuck, StepExecution.id <= newest)
    if state == StepState.SCHEDULED:
        query = query.join(Workflow, Workflow.id == StepExecution.workflow_id).where(
            Workflow.state != lateness.NOT_STUCK_WORKFLOW_STATE
        )
    if excluded:
        query = query.where(StepExecution.id.not_in(sorted(excluded)))
    # Ordered by the filtered column, so the planner walks its index (the gem's 0.6 fix).
    query = query.order_by(column, StepExecution.id).limit(batch)
    with db.new_session() as session:
        return list(session.scalars(query))


def recover_execution(execution_id: int, now: datetime | None = None) -> bool:
    """Recover one stuck execution per ``settings.stuck_recovery_action``
    (:func:`geneva_drive.recovery.recover_execution` with the stuck test)."""
    moment = now or utcnow()
    return recovery.recover_execution(execution_id, lambda _s, ex: is_stuck(ex, moment))


# --- 4. stranded waiting executions -------------------------------------------------------------


def stranded_waiting_steps(session: Session) -> list[tuple[str, str]]:
    """``(workflow type, step)`` pairs with executions parked on a step their registered class
    no longer waits in: undefined, a ``removed_step``, or without ``wait_for`` (or
    ``wait_for_children``).

    One grouped read of the waiting rows (the ``(state, scheduled_for)`` index): as many rows
    as distinct (class, step) pairs, whatever the number of waiting executions.
    """
    pairs = session.execute(
        select(Workflow.type, StepExecution.step_name)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(StepExecution.state == StepState.WAITING)
        .group_by(Workflow.type, StepExecution.step_name)
    )
    found = []
    for type_name, step_name in pairs:
        cls = registry.workflow_class(type_name)
        if cls is None:
            continue
        definition = cls.steps.named(step_name)
        if definition is None or definition.removed or not definition.parks:
            found.append((type_name, step_name))
    return found


def release_stranded_waiting() -> int:
    """Phase 4 (see the module docstring); returns how many executions it moved."""
    with db.new_session() as session:
        pairs = stranded_waiting_steps(session)
    moved = 0
    for type_name, step_name in pairs:
        # Keyset paging: each page starts after the last id seen, so a row that stays (its
        # release failed, or it is no longer stranded) is never fetched twice, and the query
        # stays one bound parameter however many rows there are.
        last_id = 0
        while True:
            with db.new_session() as session:
                ids = list(
                    session.scalars(
                        select(StepExecution.id)
                        .join(Workflow, Workflow.id == StepExecution.workflow_id)
                        .where(
                            StepExecution.state == StepState.WAITING,
                            Workflow.type == type_name,
                            Workflow.state == WorkflowState.READY,
                            StepExecution.step_name == step_name,
                            StepExecution.id > last_id,
                        )
                        .order_by(StepExecution.id)
                        .limit(settings.housekeeping_batch_size)
                    )
                )
            if not ids:
                break
            last_id = ids[-1]
            for execution_id in ids:
                try:
                    moved += _release_waiting(execution_id)
                except Exception as error:
                    log.error("Failed to release stranded execution %s: %s", execution_id, error)
                    report_error(
                        error, {"component": "housekeeping", "step_execution_id": execution_id}
                    )
    return moved


def _release_waiting(execution_id: int) -> int:
    session = db.new_session()
    try:
        locked = recovery.lock(session, execution_id)
        if locked is None:
            session.rollback()
            return 0
        workflow, execution = locked
        if execution.state != StepState.WAITING or workflow.state != WorkflowState.READY:
            session.rollback()  # moved on meanwhile (a signal, an operator)
            return 0
        definition = workflow.steps.named(execution.step_name)
        context = ContextAdapter(
            log,
            {
                "workflow": type(workflow).__name__,
                "workflow_id": workflow.id,
                "execution_id": execution.id,
                "step": execution.step_name,
            },
        )
        if definition is None:
            message = (
                f"Step '{execution.step_name}' is not defined in {type(workflow).__name__} "
                "(the execution was waiting for a signal when the step was renamed or "
                f"deleted). Resume it with resume_at(step_name), or deploy `{execution.step_name}"
                ' = renamed_step(to="...")` or a removed_step()'
            )
            # waiting -> scheduled -> failed: the state table has no waiting -> failed edge
            # (the gem's), and the executor records a missing step on a scheduled row.
            transitions.wake_execution(execution)
            transitions.fail_execution(execution)
            execution.error_message = message
            execution.error_class_name = STEP_NOT_DEFINED
            transitions.workflow_paused(workflow)
            session.flush()
            context.error("%s; pausing the workflow", message)
        else:
            signals.rendezvous_waiting(session, workflow, execution)
            context.warning("released a parked execution of a step that no longer waits here")
        session.commit()
        return 1
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# --- 5. gauges -----------------------------------------------------------------------------


def report_gauges(now: datetime) -> None:
    """Emit the gem's gauges through :func:`metrics_facade.set_gauge`.

    The counts come from :func:`geneva_drive.metrics.collect`, the same grouped queries that
    ``/metrics`` and the dashboard overview read, so the three can never disagree.
    """
    with db.new_session() as session:
        snapshot = metrics.collect(session, now)
    metrics.report_gauges(snapshot)
