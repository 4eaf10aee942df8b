"""Read-only aggregate queries: what /metrics, the overview page and the gem's gauges show.

One :func:`collect` runs seven queries (never more) and returns a
:class:`MetricsSnapshot`; :func:`get_snapshot` is the same behind a cache (5 s, single-flight,
then stale-while-revalidate), so a scrape storm or a busy overview page costs the database
seven queries per cache period, not seven per request, and a scrape never waits for them once
the cache is warm.

The three step-execution queries read one index range each, so their cost follows the
number of interesting rows (waiting, overdue, stuck), not the size of the history; each
matching row looks its workflow's ``type`` up by primary key:

=====================================  =================================================
query                                  index
=====================================  =================================================
waiting executions (+ overdue)         ``index_geneva_drive_step_executions_scheduled``
                                       (state, scheduled_for): the ``waiting`` range
overdue scheduled executions           same index: ``scheduled`` and ``scheduled_for < cutoff``
stuck in-progress executions           partial index on ``started_at`` where in_progress
unexplained workflows                  the live ranges only: workflows by ``(state, id)``,
                                       executions by state (:mod:`geneva_drive.health`)
workers by state, and the executions   the workers table (a row per worker process, pruned
in progress on a worker not live       after a day) and the ``in_progress`` range of
                                       ``index_geneva_drive_step_executions_scheduled``
schedules that fire (name and          the schedules table (a row per schedule), its
``next_fire_at``)                      ``next_fire_at`` index; at most
                                       :data:`SCHEDULE_SERIES_LIMIT` rows
=====================================  =================================================

The workflow count by (type, state) reads ``geneva_drive_workflow_counts`` (a few rows per
class and state, kept by every write of a workflow row: :mod:`geneva_drive.counts`), not the
workflows table: until an earlier review it counted every workflow row, the one query that grew with
the history kept (a few hundred milliseconds at 1M workflows on PostgreSQL,
``bench/B9_METRICS.md``).

Definitions (the numbers the alerts in ``docs/prometheus-rules.yml`` fire on):

* **waiting** — step executions parked at the signal gate (state ``waiting``), whatever the
  workflow's state, as the gem counts them.
* **waiting overdue** — waiting executions with ``waiting_since`` older than
  ``settings.waiting_visibility_threshold``; not computed when the threshold is ``None``.
* **overdue** — executions still ``scheduled`` whose ``scheduled_for`` passed more than
  ``settings.overdue_after`` ago (``dispatch_interval`` + ``overdue_grace``), of workflows
  the executor would run (``ready`` or ``performing``). A paused workflow keeps its scheduled
  execution on purpose; it is counted by ``paused_ratio``, not here, so that pausing never
  pages anyone.
* **stuck in progress** — executions ``in_progress`` that started longer ago than
  ``settings.stuck_in_progress_threshold`` and no registered worker started (exactly what
  housekeeping will recover by age; a worker's executions are judged by its lease instead).
* **paused ratio** — paused / all workflows of a class, finished and canceled included
  (the gem's denominator).
* **workers** — registered worker processes that have not stopped, ``live`` (a heartbeat
  within ``settings.worker_lease``) or ``expired`` (none within it: killed or stalled; the row
  stays a day). **expired worker steps** — executions ``in_progress`` on a worker that is not
  live: exactly what the next dispatcher sweep recovers (:mod:`geneva_drive.liveness`). Not
  per class, and measured on every collect, with or without workflows.
* **schedule late seconds** — per schedule that fires (not paused, not disabled), how far its
  ``next_fire_at`` is in the past (0 when it is not): a sweep fires a due tick within seconds,
  so a figure that grows means no dispatcher fires it (:mod:`geneva_drive.schedules`). Measured
  on every collect too; the :data:`SCHEDULE_SERIES_LIMIT` latest-due are left off beyond it.

This module only reads. It never imports Flask.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, case, func, or_, select
from sqlalchemy.orm import Session

from geneva_drive import counts, db, health, lateness, liveness, metrics_facade
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import InvalidInputError
from geneva_drive.models import ScheduleRow, StepExecution, Worker, utcnow
from geneva_drive.states import StepState, WorkflowState
from geneva_drive.workflow import Workflow

#: How long a snapshot is served from the cache (Prometheus scrapes every 15 to 60 s).
CACHE_SECONDS = 5.0
#: How much longer an expired snapshot is still served while one is refreshed in the background.
STALE_SECONDS = 60.0

log = logging.getLogger("geneva_drive.metrics")

#: Every workflow state, in display order; each class gets all of them (zeros included).
WORKFLOW_STATES: tuple[str, ...] = tuple(s.value for s in WorkflowState)
#: The worker states the snapshot counts (a stopped worker is history, not a figure to watch).
WORKER_STATES: tuple[str, ...] = ("live", "expired")
#: The most schedules the late gauge has a series for (the most late first): per-hero runtime
#: schedules may be many, and one series each must not swamp the metrics store.
SCHEDULE_SERIES_LIMIT = 500


@dataclass(frozen=True)
class ClassMetrics:
    """The numbers of one workflow class (its stored ``type``)."""

    workflow: str
    #: Workflow count per state; every state of :data:`WORKFLOW_STATES` is present.
    states: Mapping[str, int]
    waiting: int = 0
    #: ``None`` when ``waiting_visibility_threshold`` is disabled.
    waiting_overdue: int | None = 0
    overdue: int = 0
    stuck_in_progress: int = 0
    #: ``scheduled_for`` of the oldest overdue execution of this class.
    oldest_overdue_at: datetime | None = None
    #: Ongoing workflows with no explained next event (:mod:`geneva_drive.health`).
    unexplained: int = 0

    @property
    def total(self) -> int:
        return sum(self.states.values())

    @property
    def paused_ratio(self) -> float:
        total = self.total
        return self.states.get(WorkflowState.PAUSED, 0) / total if total else 0.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """Database-derived numbers at ``taken_at``, per workflow class (sorted by name)."""

    taken_at: datetime
    classes: tuple[ClassMetrics, ...]
    waiting_visibility_threshold: timedelta | None
    stuck_in_progress_threshold: timedelta
    #: Wall time the queries took, in seconds.
    query_seconds: float = 0.0
    #: How many SQL statements :func:`collect` issued (7, or 3 on an empty database).
    query_count: int = 0
    #: Workers that have not stopped, by state (every state of :data:`WORKER_STATES`).
    workers: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(WORKER_STATES, 0))
    #: Executions in progress on a worker that is not live (the next sweep recovers them).
    expired_worker_steps: int = 0
    #: Per schedule that fires: seconds its ``next_fire_at`` is in the past (0 when not).
    schedules_late: Mapping[str, float] = field(default_factory=dict)
    _by_class: dict[str, ClassMetrics] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_class.update({c.workflow: c for c in self.classes})

    def for_class(self, workflow: str) -> ClassMetrics:
        """The numbers of one class; all zeros for a class with no workflows."""
        found = self._by_class.get(workflow)
        if found is not None:
            return found
        return ClassMetrics(
            workflow=workflow,
            states=dict.fromkeys(WORKFLOW_STATES, 0),
            waiting_overdue=None if self.waiting_visibility_threshold is None else 0,
        )

    @property
    def state_totals(self) -> dict[str, int]:
        """Workflow count per state across all classes (every state present)."""
        return {s: sum(c.states[s] for c in self.classes) for s in WORKFLOW_STATES}

    @property
    def total_workflows(self) -> int:
        return sum(c.total for c in self.classes)

    @property
    def waiting(self) -> int:
        return sum(c.waiting for c in self.classes)

    @property
    def waiting_overdue(self) -> int | None:
        if self.waiting_visibility_threshold is None:
            return None
        return sum(c.waiting_overdue or 0 for c in self.classes)

    @property
    def overdue(self) -> int:
        return sum(c.overdue for c in self.classes)

    @property
    def stuck_in_progress(self) -> int:
        return sum(c.stuck_in_progress for c in self.classes)

    @property
    def unexplained(self) -> int:
        return sum(c.unexplained for c in self.classes)

    @property
    def oldest_overdue_at(self) -> datetime | None:
        found = [c.oldest_overdue_at for c in self.classes if c.oldest_overdue_at is not None]
        return min(found) if found else None

    @property
    def oldest_overdue_seconds(self) -> float:
        """How late the most overdue scheduled execution is at ``taken_at``; 0 when none is."""
        oldest = self.oldest_overdue_at
        if oldest is None:
            return 0.0
        return max(0.0, (self.taken_at - oldest).total_seconds())


def collect(session: Session, now: datetime | None = None) -> MetricsSnapshot:
    """Run the grouped queries now (no cache). Reads only; leaves the transaction to the caller."""
    now = now or utcnow()
    waiting_threshold = settings.waiting_visibility_threshold
    stuck_threshold = settings.stuck_in_progress_threshold
    started = time.perf_counter()
    # PostgreSQL: no JIT for these queries (engine/dialects/postgresql.py says why).
    dialect_for(session).tune_for_aggregates(session)
    states: dict[str, dict[str, int]] = {}
    for (workflow_type, state), count in counts.read(session).items():
        states.setdefault(workflow_type, dict.fromkeys(WORKFLOW_STATES, 0))[state] = count
    per_class: dict[str, dict[str, Any]] = {t: {} for t in states}
    live, expired, held = session.execute(_workers(now)).one()
    late = {
        str(name): max(0.0, (now - due).total_seconds())
        for name, due in session.execute(_schedules_due())
    }
    # No workflows means no executions: a fresh install scrapes in three queries.
    if states:
        _count_executions(session, per_class, now, waiting_threshold, stuck_threshold)
    classes = tuple(
        ClassMetrics(
            workflow=workflow_type,
            states=states.get(workflow_type) or dict.fromkeys(WORKFLOW_STATES, 0),
            waiting=values.get("waiting", 0),
            waiting_overdue=(
                None if waiting_threshold is None else values.get("waiting_overdue", 0)
            ),
            overdue=values.get("overdue", 0),
            stuck_in_progress=values.get("stuck_in_progress", 0),
            oldest_overdue_at=values.get("oldest_overdue_at"),
            unexplained=values.get("unexplained", 0),
        )
        for workflow_type, values in sorted(per_class.items())
    )
    return MetricsSnapshot(
        taken_at=now,
        classes=classes,
        waiting_visibility_threshold=waiting_threshold,
        stuck_in_progress_threshold=stuck_threshold,
        query_seconds=time.perf_counter() - started,
        query_count=7 if states else 3,
        workers={"live": int(live or 0), "expired": int(expired or 0)},
        expired_worker_steps=int(held or 0),
        schedules_late=late,
    )


def _count_executions(
    session: Session,
    per_class: dict[str, dict[str, Any]],
    now: datetime,
    waiting_threshold: timedelta | None,
    stuck_threshold: timedelta,
) -> None:
    """The step-execution queries and the unexplained count, merged into ``per_class``
    (NULL type: not counted)."""
    for workflow_type, waiting, overdue in session.execute(_waiting(lateness.waiting_cutoff(now))):
        if workflow_type is not None:
            per_class.setdefault(workflow_type, {}).update(
                waiting=waiting, waiting_overdue=int(overdue or 0)
            )
    for workflow_type, overdue, oldest in session.execute(_overdue(now)):
        if workflow_type is not None:
            per_class.setdefault(workflow_type, {}).update(
                overdue=overdue, oldest_overdue_at=oldest
            )
    for workflow_type, stuck in session.execute(_stuck(now)):
        if workflow_type is not None:
            per_class.setdefault(workflow_type, {})["stuck_in_progress"] = stuck
    # The doctor's rules, one grouped query over the live set (index-backed, see health).
    for workflow_type, count in health.counts(session, now).items():
        per_class.setdefault(workflow_type, {})["unexplained"] = count


# --- the queries -----------------------------------------------------------------------------

_se = StepExecution.__table__


def _workflows_table() -> Any:
    return Workflow.__table__


def _workflow_type(*, runnable_only: bool = False) -> Any:
    """The execution's workflow type, looked up by primary key row by row.

    A correlated scalar subquery on purpose: PostgreSQL cannot flatten it into a join, so the
    cost follows the matching executions (a few, normally), never the workflows table. As a
    join, the planner, misled by the many past ``scheduled_for`` values of finished history,
    hash-joins against a scan of every workflow. With ``runnable_only`` it is NULL for
    workflows the executor would not run (paused, terminal); that group is dropped.
    """
    w = _workflows_table()
    lookup = select(w.c.type).where(w.c.id == _se.c.workflow_id)
    if runnable_only:
        lookup = lookup.where(w.c.state.in_(sorted(lateness.OVERDUE_WORKFLOW_STATES)))
    return lookup.scalar_subquery()


def _grouped(rows: Any, *aggregates: Any) -> Any:
    inner = rows.subquery()
    return (
        select(inner.c.workflow_type, func.count(), *(agg(inner) for agg in aggregates))
        # The NULL group (not runnable) is dropped in Python: a WHERE on it could make the
        # database evaluate the lookup twice per row.
        .group_by(inner.c.workflow_type)
    )


def _waiting(overdue_cutoff: datetime | None) -> Any:
    rows = select(
        _workflow_type().label("workflow_type"), _se.c.waiting_since.label("since")
    ).where(_se.c.state == StepState.WAITING)
    if overdue_cutoff is None:
        return _grouped(rows, lambda t: func.sum(0))
    return _grouped(rows, lambda t: func.sum(case((t.c.since < overdue_cutoff, 1), else_=0)))


def _overdue(now: datetime) -> Any:
    rows = select(
        _workflow_type(runnable_only=True).label("workflow_type"),
        _se.c.scheduled_for.label("due"),
    ).where(lateness.overdue_condition(now))
    return _grouped(rows, lambda t: func.min(t.c.due))


def _stuck(now: datetime) -> Any:
    rows = select(_workflow_type().label("workflow_type")).where(
        lateness.stuck_in_progress_condition(now)
    )
    return _grouped(rows)


def _workers(now: datetime) -> Any:
    """One row: live workers, expired workers, and the executions in progress on a worker that
    is not live (stopped, expired, or its row gone). Live means what
    :func:`geneva_drive.liveness.is_live` says: not stopped, a heartbeat after the cutoff."""
    w = Worker.__table__
    cutoff = liveness.lease_cutoff(now)
    holder = w.alias("holder")
    held = (
        select(func.count())
        .select_from(_se.outerjoin(holder, holder.c.id == _se.c.worker_id))
        .where(
            _se.c.state == StepState.IN_PROGRESS,
            _se.c.worker_id.is_not(None),
            or_(
                holder.c.id.is_(None),
                holder.c.stopped_at.is_not(None),
                holder.c.heartbeat_at <= cutoff,
            ),
        )
        .scalar_subquery()
    )
    running = w.c.stopped_at.is_(None)
    return select(
        func.sum(case((and_(running, w.c.heartbeat_at > cutoff), 1), else_=0)),
        func.sum(case((and_(running, w.c.heartbeat_at <= cutoff), 1), else_=0)),
        held,
    ).select_from(w)


def _schedules_due() -> Any:
    """The name and next tick of every schedule that fires (not paused, not disabled), the most
    late first, at most :data:`SCHEDULE_SERIES_LIMIT`."""
    return (
        select(ScheduleRow.name, ScheduleRow.next_fire_at)
        .where(ScheduleRow.paused.is_(False), ScheduleRow.disabled_at.is_(None))
        .order_by(ScheduleRow.next_fire_at, ScheduleRow.id)
        .limit(SCHEDULE_SERIES_LIMIT)
    )


# --- the cache -------------------------------------------------------------------------------


class SnapshotCache:
    """Serves snapshots from memory; the queries run at most once per ``max_age`` seconds.

    * Younger than ``max_age``: served as is.
    * Older, but by less than ``stale_for`` more: served as is, and one background thread
      refreshes it (stale-while-revalidate), so a scrape never waits for the queries once the
      cache is warm. At 1M workflows the queries take a few hundred milliseconds on
      PostgreSQL; Prometheus and the overview page should not pay that on every request.
    * Missing or older still: refreshed in the caller's thread. Concurrent callers wait for
      that one refresh instead of each running the queries (a scrape storm costs one set).

    Snapshots are kept per database engine and per threshold settings, so changing a
    threshold shows at once. ``max_age=0`` always queries, in the caller's thread.
    """

    def __init__(
        self,
        max_age: float = CACHE_SECONDS,
        *,
        stale_for: float = STALE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age = max_age
        self.stale_for = stale_for
        self._clock = clock
        self._lock = threading.Lock()  # held while querying: one refresh at a time
        self._entries: dict[tuple[Any, ...], tuple[float, MetricsSnapshot]] = {}
        self._background: threading.Thread | None = None

    def get(
        self,
        session: Session | None = None,
        *,
        max_age: float | None = None,
        bind: Engine | None = None,
    ) -> MetricsSnapshot:
        age_limit = self.max_age if max_age is None else max_age
        engine = bind or (session.get_bind() if session is not None else db.get_engine())
        key = (
            engine,
            settings.waiting_visibility_threshold,
            settings.stuck_in_progress_threshold,
            settings.overdue_after,
        )
        entry = self._entries.get(key)
        if entry is not None and age_limit > 0:
            age = self._clock() - entry[0]
            if age < age_limit:
                return entry[1]
            if age < age_limit + self.stale_for:
                self._refresh_in_background(key, engine, age_limit)
                return entry[1]
        with self._lock:
            entry = self._entries.get(key)  # another thread may have refreshed meanwhile
            if entry is not None and age_limit > 0 and self._clock() - entry[0] < age_limit:
                return entry[1]
            return self._refresh(key, session, engine)

    def clear(self) -> None:
        self.join()
        with self._lock:
            self._entries = {}

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background refresh in flight (tests, shutdown)."""
        thread = self._background
        if thread is not None:
            thread.join(timeout)

    def _refresh(
        self, key: tuple[Any, ...], session: Session | None, engine: Any
    ) -> MetricsSnapshot:
        if session is not None:
            snapshot = collect(session)
        else:
            with Session(engine) as own:
                try:
                    snapshot = collect(own)
                finally:
                    own.rollback()
        self._entries = {key: (self._clock(), snapshot)}
        return snapshot

    def _refresh_in_background(self, key: tuple[Any, ...], engine: Any, age_limit: float) -> None:
        if self._background is not None and self._background.is_alive():
            return
        if not self._lock.acquire(blocking=False):
            return  # a refresh is running already
        thread = threading.Thread(
            target=self._run_background,
            args=(key, engine, age_limit),
            name="geneva-drive-metrics-refresh",
            daemon=True,
        )
        self._background = thread
        try:
            thread.start()
        except BaseException:
            self._lock.release()
            raise

    def _run_background(self, key: tuple[Any, ...], engine: Any, age_limit: float) -> None:
        try:  # the lock was taken by the thread that started this one
            entry = self._entries.get(key)
            if entry is None or self._clock() - entry[0] >= age_limit:
                self._refresh(key, None, engine)
        except Exception:
            log.exception("refreshing the metrics snapshot failed; serving the previous one")
        finally:
            self._lock.release()


_cache = SnapshotCache()


def get_snapshot(
    session: Session | None = None,
    *,
    max_age: float | None = None,
    bind: Engine | None = None,
) -> MetricsSnapshot:
    """The numbers of the overview page and of ``/metrics``, at most ``max_age`` s old.

    With ``session`` the queries (when due) run in it, e.g. Flask-SQLAlchemy's ``db.session``;
    without one they run in a short session of their own on ``bind`` (default: the engine's
    database), which any thread may do. ``max_age=0`` bypasses the cache.
    """
    return _cache.get(session, max_age=max_age, bind=bind)


def clear_cache() -> None:
    _cache.clear()


def cache_max_age() -> float:
    """The configured cache period (seconds) of the database gauges; 0 means no cache."""
    return _cache.max_age


def configure_cache(*, max_age: float | None = None, stale_for: float | None = None) -> None:
    """Tune the process-wide cache behind :func:`get_snapshot` (seconds; 0 disables).

    The dashboard reads ``GENEVA_METRICS_CACHE_SECONDS``. A longer period trades freshness for
    database time: at 1M workflows one refresh costs a few hundred milliseconds.
    """
    if max_age is not None:
        if max_age < 0:
            raise InvalidInputError("max_age must not be negative")
        _cache.max_age = float(max_age)
    if stale_for is not None:
        if stale_for < 0:
            raise InvalidInputError("stale_for must not be negative")
        _cache.stale_for = float(stale_for)


# --- the gem's gauges ------------------------------------------------------------------------

GaugeSetter = Callable[[str, float, Mapping[str, str]], None]


def report_gauges(snapshot: MetricsSnapshot, set_gauge: GaugeSetter | None = None) -> None:
    """Emit the gem's housekeeping gauges through the metrics facade.

    ``geneva_drive.<state>`` (total, and per ``workflow`` for the classes that have any in that
    state), ``geneva_drive.paused_ratio`` per class, ``geneva_drive.waiting_step_executions``
    (total and per class with waiters) and, unless the visibility threshold is disabled,
    ``geneva_drive.waiting_overdue`` (total and per class with overdue waiters).
    """
    if set_gauge is None:
        set_gauge = metrics_facade.set_gauge
    for state, total in snapshot.state_totals.items():
        if total:
            set_gauge(f"geneva_drive.{state}", total, {})
    for cls in snapshot.classes:
        for state, count in cls.states.items():
            if count:
                set_gauge(f"geneva_drive.{state}", count, {"workflow": cls.workflow})
        if cls.total:
            set_gauge("geneva_drive.paused_ratio", cls.paused_ratio, {"workflow": cls.workflow})
    set_gauge("geneva_drive.waiting_step_executions", snapshot.waiting, {})
    for cls in _having(snapshot.classes, "waiting"):
        set_gauge("geneva_drive.waiting_step_executions", cls.waiting, {"workflow": cls.workflow})
    if snapshot.waiting_overdue is not None:
        set_gauge("geneva_drive.waiting_overdue", snapshot.waiting_overdue, {})
        for cls in _having(snapshot.classes, "waiting_overdue"):
            set_gauge(
                "geneva_drive.waiting_overdue", cls.waiting_overdue or 0, {"workflow": cls.workflow}
            )


def _having(classes: Iterable[ClassMetrics], attribute: str) -> list[ClassMetrics]:
    return [c for c in classes if getattr(c, attribute)]
