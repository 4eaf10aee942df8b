"""Read queries of the dashboard: bounded, index-backed, never a whole-table scan per view.

Lists page with keysets on ``id`` (every workflow index ends in ``id``: ``(type, state, id)``,
``(state, id)``, the primary key), so ``WHERE state = :s AND id < :after ORDER BY id DESC
LIMIT n`` walks one index range and stops after ``n`` rows — the row-value comparison
``(state, id) < (:s, :after)`` with the equality prefix spelled out so every planner uses the
index. Nothing here uses OFFSET, and no count runs over a whole table: counts are grouped (one
index-only pass) and cached briefly, or capped with a ``LIMIT`` inside the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlencode

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Engine,
    Select,
    Table,
    and_,
    exists,
    func,
    or_,
    select,
    true,
    tuple_,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, aliased

from geneva_drive import children, db, lateness, limits, rollups
from geneva_drive.dialects import dialect_for
from geneva_drive.dialects.base import SubqueryFirst
from geneva_drive.models import OperatorAction, Signal, StepExecution, utcnow
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    ONGOING_WORKFLOW_STATES,
    StepState,
    WorkflowState,
)
from geneva_drive.workflow import Workflow, registered_workflows, workflow_class

if TYPE_CHECKING:
    from geneva_drive.metrics import MetricsSnapshot

T = TypeVar("T")

#: Values of the ``due`` filter: which kind of late current execution a workflow has, or
#: (``timed_out``) an execution whose wait for a signal timed out (docs/MANUAL.md, "Time-bounded waits").
#: (``failed``) paused after an error: its newest execution failed (a parent's children).
DUE_FILTERS = ("overdue", "waiting", "stuck", "timed_out", "failed", "held")


def dashboard_config() -> Mapping[str, Any]:
    """The dashboard's settings (page size, cache time) of the current app. Imported when
    called: the ``geneva-drive workflows`` commands use this module in a process without
    Flask, and never call what needs the app."""
    from geneva_drive.dashboard.state import dashboard_config as current_config

    return current_config()


# --- the workflows list ----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowFilters:
    """The list's filters, exactly the query parameters of ``/workflows`` (deep-linkable)."""

    cls: str = ""
    state: str = ""
    hero_type: str = ""
    hero_id: str = ""
    step: str = ""
    error: str = ""
    q: str = ""
    due: str = ""
    #: A step the class no longer defines: the workflows paused because of it (``/stranded``).
    stranded: str = ""
    #: A parent's id: its child workflows (docs/MANUAL.md, "Fan-out and join: child workflows"; the parent_id index).
    parent: str = ""
    #: A concurrency or rate limit's name (docs/MANUAL.md, "Concurrency and rate limits", ``/limits``): workflows whose current
    #: execution counts against it; ``limit_key`` narrows that to one key.
    limit: str = ""
    limit_key: str = ""

    @classmethod
    def from_args(cls, args: Any) -> WorkflowFilters:
        def get(name: str) -> str:
            return clean_text(args.get(name, ""))

        due = get("due")
        return cls(
            cls=get("class"),
            state=get("state"),
            hero_type=get("hero_type"),
            hero_id=get("hero_id"),
            step=get("step"),
            error=get("error"),
            q=get("q"),
            due=due if due in DUE_FILTERS else "",
            stranded=get("stranded"),
            parent=get("parent"),
            limit=get("limit"),
            limit_key=args.get("limit_key", "") if get("limit") else "",
        )

    def as_params(self) -> dict[str, str]:
        """The non-empty filters as query parameters (``class`` spelled as in the URL)."""
        pairs = {
            "class": self.cls,
            "state": self.state,
            "hero_type": self.hero_type,
            "hero_id": self.hero_id,
            "step": self.step,
            "error": self.error,
            "q": self.q,
            "due": self.due,
            "stranded": self.stranded,
            "parent": self.parent,
            "limit": self.limit,
            "limit_key": self.limit_key,
        }
        return {k: v for k, v in pairs.items() if v}

    def query_string(self, **extra: Any) -> str:
        params = self.as_params()
        params.update({k: str(v) for k, v in extra.items() if v not in (None, "")})
        return urlencode(params)

    @property
    def is_empty(self) -> bool:
        return not self.as_params()

    def without(self, name: str) -> WorkflowFilters:
        return replace(self, **{name: ""})


def paused_after_error_messages(session: Session, ids: list[int]) -> dict[int, str]:
    """``{workflow_id: error message}`` of those of ``ids`` whose newest execution failed (the
    list shows it under a child's why-line); one read of the executions' workflow index."""
    if not ids:
        return {}
    rows = session.execute(
        select(StepExecution.workflow_id, StepExecution.error_message)
        .where(
            StepExecution.workflow_id.in_(ids),
            StepExecution.state == StepState.FAILED,
            StepExecution.error_message.is_not(None),
        )
        .order_by(StepExecution.id)
    )
    found = {int(workflow_id): str(message) for workflow_id, message in rows}
    newest = session.execute(
        select(StepExecution.workflow_id, func.max(StepExecution.id))
        .where(StepExecution.workflow_id.in_(list(found)))
        .group_by(StepExecution.workflow_id)
    )
    failed_last = set(
        session.scalars(
            select(StepExecution.workflow_id).where(
                StepExecution.id.in_([n for _, n in newest]),
                StepExecution.state == StepState.FAILED,
            )
        )
    )
    return {k: v for k, v in found.items() if k in failed_last}


def _error_class_is(name: str) -> Any:
    """The executions whose error class is ``name``: the full dotted name, or a short one
    (``CardDeclined``, as the lists print it) matching the last component of any module's."""
    column = StepExecution.error_class_name
    if "." in name:
        return column == name
    return or_(column == name, column.endswith("." + name, autoescape=True))


def _search(q: str) -> Any:
    """``q``: a workflow id (``42`` or ``#42``), or a hero as ``Type:id`` / ``Type/id``."""
    text = q.lstrip("#")
    if text.isascii() and text.isdigit():
        number = parse_id(text)
        return Workflow.id == number if number is not None else Workflow.id.is_(None)
    for separator in (":", "/"):
        hero_type, sep, hero_id = q.partition(separator)
        if sep and hero_type and hero_id:
            return and_(Workflow.hero_type == hero_type, Workflow.hero_id == hero_id)
    # Not an id or a hero: match nothing rather than scan the table for a substring.
    return Workflow.id.is_(None)


def _current_execution_in(*states: str, extra: Any = None) -> Any:
    # ``id IN (SELECT workflow_id … WHERE state …)``, not a correlated EXISTS: the executions
    # side is what the index narrows ((state, scheduled_for), the in_progress index), and
    # SQLite would run an EXISTS once per workflow row, walking the whole table to find 50.
    condition: Any = StepExecution.state.in_(states) if states else true()
    if extra is not None:
        condition = and_(condition, extra)
    return Workflow.id.in_(select(StepExecution.workflow_id).where(condition))


#: ``Workflow.id IN (executions subquery)``, evaluated subquery first on PostgreSQL.
_ExecutionsFirst = SubqueryFirst


class _StartsWith(ColumnElement[bool]):
    """``column`` begins with ``prefix``, whatever the column's collation.

    ``LIKE 'prefix%'`` with the prefix's wildcards escaped. A range ``>= 'name/' AND <
    'name0'`` relies on byte order, which a collation need not keep: glibc's en_US.UTF-8 and
    ICU's "shifted" collations ignore punctuation at the first level, so ``name/acme`` sorts
    after ``name0`` there. MySQL and MariaDB read the index for a constant LIKE prefix;
    PostgreSQL does only under the "C" collation (or a ``text_pattern_ops`` index) and
    otherwise filters the rows its other terms found. SQLite compares text bytewise (no
    column here declares another collation) and its LIKE ignores case and the index, so it
    keeps the exact range.
    """

    type = Boolean()
    inherit_cache = False  # its prefix is a bound value the cache key would not see
    _is_implicitly_boolean = True

    def __init__(self, column: Any, prefix: str) -> None:
        self.column = column
        self.prefix = prefix


@compiles(_StartsWith)
def _starts_with_default(element: _StartsWith, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.column.startswith(element.prefix, autoescape=True), **kw))


@compiles(_StartsWith, "sqlite")
def _starts_with_sqlite(element: _StartsWith, compiler: Any, **kw: Any) -> str:
    prefix = element.prefix
    successor = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    column = element.column
    return str(compiler.process(and_(column >= prefix, column < successor), **kw))


def filtered_workflows(filters: WorkflowFilters, now: datetime | None = None) -> Select[Any]:
    """``select(Workflow)`` narrowed by ``filters`` (no ordering, no limit)."""
    now = now or utcnow()
    stmt = select(Workflow)
    if filters.cls:
        stmt = stmt.where(Workflow.type == filters.cls)
    if filters.state:
        stmt = stmt.where(Workflow.state == filters.state)
    if filters.hero_type:
        stmt = stmt.where(Workflow.hero_type == filters.hero_type)
    if filters.hero_id:
        stmt = stmt.where(Workflow.hero_id == filters.hero_id)
    if filters.parent:
        parent_id = parse_id(filters.parent.lstrip("#"))
        # Not an id: match nothing (as the id search does), never a 500.
        stmt = stmt.where(
            Workflow.parent_id == parent_id if parent_id is not None else Workflow.id.is_(None)
        )
    if filters.step:
        stmt = stmt.where(Workflow.next_step_name == filters.step)
    if filters.error:
        # The (error_class_name, state, workflow_id) index finds the failed executions of that
        # error class; a correlated EXISTS would probe every workflow row instead.
        stmt = stmt.where(
            Workflow.id.in_(
                select(StepExecution.workflow_id).where(
                    _error_class_is(filters.error),
                    StepExecution.state == StepState.FAILED,
                )
            )
        )
    if filters.q:
        stmt = stmt.where(_search(filters.q))
    if filters.stranded:
        stmt = stmt.where(_stranded_on(filters.cls, filters.stranded))
    if filters.limit:
        stmt = stmt.where(_under_limit(filters.limit, filters.limit_key))
    if filters.due == "overdue":
        stmt = stmt.where(
            Workflow.state.in_(sorted(lateness.OVERDUE_WORKFLOW_STATES)),
            _current_execution_in(extra=lateness.overdue_condition(now)),
        )
    elif filters.due == "held":
        # Held back by a limit past the grace (engine/lateness.py): the deferred_on index.
        held = select(StepExecution.workflow_id).where(lateness.held_late_condition(now))
        stmt = stmt.where(
            Workflow.state.in_(sorted(lateness.OVERDUE_WORKFLOW_STATES)),
            _ExecutionsFirst(Workflow.id, held),
        )
    elif filters.due == "waiting":
        stmt = stmt.where(_current_execution_in(StepState.WAITING))
    elif filters.due == "stuck":
        # Executions first: the stuck ones are few (the in_progress index), the workflows many.
        stuck = select(StepExecution.workflow_id).where(lateness.stuck_in_progress_condition(now))
        stmt = stmt.where(_ExecutionsFirst(Workflow.id, stuck))
    elif filters.due == "failed":
        stmt = stmt.where(
            Workflow.state == WorkflowState.PAUSED, children.paused_after_error(Workflow.id)
        )
    elif filters.due == "timed_out":
        # The partial index on workflow_id WHERE timed_out_at IS NOT NULL (migration 0005).
        stmt = stmt.where(
            Workflow.id.in_(
                select(StepExecution.workflow_id).where(StepExecution.timed_out_at.is_not(None))
            )
        )
    return stmt


#: The keys per limit the /limits page lists (those with the most waiting).
LIMIT_TOP_KEYS = 10


def _under_limit(name: str, key: str) -> Any:
    """Workflows whose current execution counts against limit ``name`` (of ``key``, when
    given): the partial slot indexes (migration 0008) where the backend can read them for
    a prefix (``_StartsWith``)."""
    conditions = []
    for column in (
        StepExecution.limit_slot,
        StepExecution.step_limit_slot,
        StepExecution.rate_slot,
    ):
        if key:
            conditions.append(column == limits.slot_of(name, key))
        else:
            # Every key of the name: the slots "name/…", by a prefix match that holds under
            # any collation (a range between "name/" and "name0" does not).
            conditions.append(_StartsWith(column, f"{name}/"))
    return Workflow.id.in_(
        select(StepExecution.workflow_id).where(
            or_(*conditions),
            StepExecution.state.in_([StepState.SCHEDULED, StepState.IN_PROGRESS]),
        )
    )


@dataclass
class Page:
    """One keyset page, newest first, with the cursors for the neighbouring pages."""

    items: list[Any]
    newer: int | None = None
    older: int | None = None


#: The largest id a BIGINT column holds; anything larger cannot name a row.
MAX_ID = 2**63 - 1


def parse_id(value: Any) -> int | None:
    """An id typed or sent by a client: ASCII digits within BIGINT range, else None.

    (``str.isdigit`` also accepts "²" or "٣", and a 30-digit number overflows the column.)
    """
    text = str(value if value is not None else "").strip().lstrip("#")
    # More than 19 digits is past BIGINT anyway; int() of a 400,000-digit string would raise
    # (Python's int_max_str_digits) instead of answering "no such id".
    if not text or len(text) > 19 or not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number <= MAX_ID else None


def clean_text(value: Any) -> str:
    """A filter value as text without NUL characters (PostgreSQL refuses them in queries)."""
    return str(value or "").replace("\x00", "").strip()


def _int_arg(value: Any) -> int | None:
    return parse_id(value)


def keyset_page(
    session: Session,
    stmt: Select[Any],
    id_column: Any,
    *,
    after: Any = None,
    before: Any = None,
    limit: int,
) -> Page:
    """Page ``stmt`` newest-first on ``id_column``: ``after`` goes older, ``before`` newer."""
    after_id, before_id = _int_arg(after), _int_arg(before)
    if before_id is not None:
        rows = list(
            session.scalars(
                stmt.where(id_column > before_id).order_by(id_column.asc()).limit(limit + 1)
            )
        )
        more_newer = len(rows) > limit
        rows = list(reversed(rows[:limit]))
        page = Page(rows)
        page.newer = _id(rows[0]) if rows and more_newer else None
        page.older = _id(rows[-1]) if rows else before_id
        return page
    if after_id is not None:
        stmt = stmt.where(id_column < after_id)
    rows = list(session.scalars(stmt.order_by(id_column.desc()).limit(limit + 1)))
    more_older = len(rows) > limit
    rows = rows[:limit]
    page = Page(rows)
    page.older = _id(rows[-1]) if rows and more_older else None
    page.newer = _id(rows[0]) if rows and after_id is not None else None
    return page


def _id(row: Any) -> int:
    return int(row.id)


def workflow_page(
    session: Session,
    filters: WorkflowFilters,
    after: Any = None,
    before: Any = None,
    upto: int | None = None,
) -> Page:
    """One page of the list. ``upto`` pins the first page to the rows it showed (ids up to
    it): a refresh updates them but does not push newer rows in above what is being read."""
    limit = int(dashboard_config()["PAGE_SIZE"])
    if filters.due == "overdue":
        return overdue_page(session, filters, after, before, limit)
    stmt = filtered_workflows(filters)
    if upto is not None:
        stmt = stmt.where(Workflow.id <= upto)
    return keyset_page(session, stmt, Workflow.id, after=after, before=before, limit=limit)


def _overdue_rows(filters: WorkflowFilters, now: datetime) -> Select[Any]:
    """``filters`` (with ``due=overdue``) joined to the overdue execution, for its lateness."""
    return filtered_workflows(filters, now).join(
        StepExecution,
        and_(StepExecution.workflow_id == Workflow.id, lateness.overdue_condition(now)),
    )


def overdue_page(
    session: Session, filters: WorkflowFilters, after: Any, before: Any, limit: int
) -> Page:
    """The overdue list, most late first (DASHBOARD.md: lists that answer "how late" sort by
    it): keyset on (``scheduled_for``, id) of the overdue execution, walked through the
    ``(state, scheduled_for)`` executions index. ``after``/``before`` are workflow ids; a
    cursor whose row is no longer overdue starts from the top again."""
    now = utcnow()
    stmt = _overdue_rows(filters, now)
    due, wid = StepExecution.scheduled_for, Workflow.id

    def due_of(cursor: int | None) -> datetime | None:
        if cursor is None:
            return None
        found = session.scalar(
            select(StepExecution.scheduled_for).where(
                StepExecution.workflow_id == cursor, lateness.overdue_condition(now)
            )
        )
        return found  # type: ignore[no-any-return]

    after_id, before_id = _int_arg(after), _int_arg(before)
    before_due, after_due = due_of(before_id), due_of(after_id)
    if before_id is not None and before_due is not None:
        more_late = or_(due < before_due, and_(due == before_due, wid < before_id))
        rows = list(
            session.scalars(stmt.where(more_late).order_by(due.desc(), wid.desc()).limit(limit + 1))
        )
        page = Page(list(reversed(rows[:limit])))
        page.newer = _id(page.items[0]) if page.items and len(rows) > limit else None
        page.older = _id(page.items[-1]) if page.items else None
        return page
    if after_id is not None and after_due is not None:
        stmt = stmt.where(or_(due > after_due, and_(due == after_due, wid > after_id)))
    rows = list(session.scalars(stmt.order_by(due.asc(), wid.asc()).limit(limit + 1)))
    page = Page(rows[:limit])
    page.older = _id(page.items[-1]) if page.items and len(rows) > limit else None
    page.newer = _id(page.items[0]) if page.items and after_due is not None else None
    return page


#: Newer rows counted above a pinned first page ("25+ newer workflows").
NEWER_CAP = 25


def newer_count(session: Session, filters: WorkflowFilters, upto: int) -> int:
    """How many rows matching ``filters`` are newer than ``upto`` (at most NEWER_CAP + 1)."""
    stmt = filtered_workflows(filters).with_only_columns(Workflow.id).where(Workflow.id > upto)
    return _capped_count(session, stmt, NEWER_CAP)


def ids_before(
    session: Session, filters: WorkflowFilters, before: int | None, limit: int
) -> list[int]:
    """The next ``limit`` ids of the filtered selection below ``before``, newest first.

    A background bulk action walks its selection with this keyset: rows it has changed may
    leave the filter (paused → ready), and the cursor never revisits or skips a row for it.
    """
    stmt = filtered_workflows(filters).with_only_columns(Workflow.id)
    if before is not None:
        stmt = stmt.where(Workflow.id < before)
    return list(session.scalars(stmt.order_by(Workflow.id.desc()).limit(limit)))


def capped_ids(session: Session, filters: WorkflowFilters, cap: int) -> list[int]:
    """Ids of the filtered selection, at most ``cap + 1`` (one more says "over the cap")."""
    stmt = filtered_workflows(filters).with_only_columns(Workflow.id)
    return list(session.scalars(stmt.order_by(Workflow.id.desc()).limit(cap + 1)))


# --- small cache for grouped counts ------------------------------------------------------------


def cached(key: str, compute: Callable[[], T]) -> T:
    """Per-app cache of a grouped count for ``COUNTS_CACHE_SECONDS`` (0 disables)."""
    from flask import current_app

    ttl = float(dashboard_config().get("COUNTS_CACHE_SECONDS", 0))
    store: dict[str, tuple[float, Any]] = current_app.extensions.setdefault("geneva_counts", {})
    hit = store.get(key)
    now = time.monotonic()
    if ttl > 0 and hit is not None and now - hit[0] < ttl:
        return hit[1]  # type: ignore[no-any-return]
    value = compute()
    store[key] = (now, value)
    return value


def _capped_count(session: Session, stmt: Select[Any], cap: int) -> int:
    """``count(*)`` of at most ``cap + 1`` rows: enough to print "10,000+" without a scan."""
    inner = stmt.limit(cap + 1).subquery()
    return int(session.scalar(select(func.count()).select_from(inner)) or 0)


# --- overview ---------------------------------------------------------------------------------

COUNT_CAP = 10_000


@dataclass
class Overview:
    counts: dict[str, dict[str, int]]
    #: paused / all workflows of the class (the ``geneva_drive_paused_ratio`` gauge).
    ratios: dict[str, float]
    overdue: int
    stuck_scheduled: int
    waiting_overdue: int
    stuck_in_progress: int
    stranded: int
    failures: list[FailureGroup]
    #: Paused workflows across classes, and steps parked for a signal (any age).
    paused_total: int = 0
    waiting_total: int = 0
    #: How late the most overdue scheduled execution is (0 when none is).
    oldest_overdue_seconds: float = 0.0
    #: Ongoing workflows with no explained next event (the ``/unexplained`` list; the gauge).
    unexplained: int = 0
    failures_window: str = "1h"
    now: datetime = field(default_factory=utcnow)


@contextmanager
def snapshot_beside(session: Session) -> Iterator[futures.Future[MetricsSnapshot]]:
    """The metrics snapshot the overview shows, computed on a connection of its own while the
    caller runs the page's other statements on ``session``; waited for on leaving.

    The snapshot's statements do not depend on the page's, and its largest, the
    unexplained-workflows count, reads the whole live set (60 of the page's 120 ms at 1M
    workflows on MariaDB, bench/NOTES.md): side by side the page costs the longer of
    the two, not their sum.
    """
    from geneva_drive import metrics

    ttl = float(dashboard_config().get("COUNTS_CACHE_SECONDS", 0))
    bind = session.get_bind()
    pending: futures.Future[MetricsSnapshot]
    if db.serves_threads(bind):
        pending = db.run_beside(metrics.get_snapshot, max_age=ttl, bind=cast(Engine, bind))
    else:
        # One connection for every thread (a session bound to a host's test transaction, an
        # in-memory SQLite): it cannot serve two at once, so the snapshot is read here.
        pending = futures.Future()
        pending.set_result(metrics.get_snapshot(session, max_age=ttl))
    try:
        yield pending
    finally:
        futures.wait([pending])  # never left running past the request (its engine may go)


def overview(
    session: Session,
    failures_window: str = "1h",
    snapshot: futures.Future[MetricsSnapshot] | None = None,
) -> Overview:
    """The overview's numbers. The per-class counts, waiting and stuck numbers are
    ``geneva_drive.metrics``' snapshot, the very numbers ``/metrics`` exports (one grouped query set,
    cached and refreshed in the background), so the page and the alerts never disagree. The
    overdue card is counted with the query of the list it links to (same rows, same instant).

    ``snapshot`` is one :func:`snapshot_beside` computes; without it the snapshot is read in
    ``session``, after the rest."""
    from geneva_drive import metrics

    now = utcnow()
    ttl = float(dashboard_config().get("COUNTS_CACHE_SECONDS", 0))

    def compute() -> Overview:
        # The overdue card is the list behind it (``/workflows?due=overdue``): the same query,
        # at the same instant, so its count, its "latest is late by" and its "late by more than
        # the stuck threshold" describe exactly the rows the list shows. (From the metrics
        # snapshot it could be a refresh older than the list and contradict it.)
        overdue_rows = _overdue_rows(WorkflowFilters(due="overdue"), now)
        oldest_due = _aware(
            session.scalar(
                overdue_rows.with_only_columns(StepExecution.scheduled_for)
                .order_by(StepExecution.scheduled_for.asc())
                .limit(1)
            )
        )
        overdue_count = _capped_count(
            session, overdue_rows.with_only_columns(Workflow.id), COUNT_CAP
        )
        # The waiting card is the inbox behind it: signal waiters only (a join waits for its
        # children, not for a signal), counted with the inbox's own query.
        waiters = _signal_waiters(select(StepExecution.id))
        waiting_total = _capped_count(session, waiters, COUNT_CAP)
        cutoff = lateness.waiting_cutoff(now)
        waiting_overdue = (
            0
            if cutoff is None
            else _capped_count(
                session, waiters.where(StepExecution.waiting_since < cutoff), COUNT_CAP
            )
        )
        stuck_listed = _capped_count(
            session,
            overdue_rows.with_only_columns(Workflow.id).where(
                lateness.stuck_scheduled_condition(now)
            ),
            COUNT_CAP,
        )
        stranded = sum(g.count for g in stranded_groups(session))
        failures = failure_groups(session, FAILURE_WINDOWS[failures_window], limit=10)
        numbers = (
            snapshot.result()
            if snapshot is not None
            else metrics.get_snapshot(session, max_age=ttl)
        )
        return Overview(
            counts={c.workflow: dict(c.states) for c in numbers.classes},
            ratios={c.workflow: c.paused_ratio for c in numbers.classes},
            overdue=overdue_count,
            stuck_scheduled=stuck_listed,
            waiting_overdue=waiting_overdue,
            stuck_in_progress=numbers.stuck_in_progress,
            stranded=stranded,
            failures=failures,
            paused_total=numbers.state_totals.get(str(WorkflowState.PAUSED), 0),
            waiting_total=waiting_total,
            oldest_overdue_seconds=(
                max(0.0, (now - oldest_due).total_seconds()) if oldest_due else 0.0
            ),
            unexplained=numbers.unexplained,
            failures_window=failures_window,
            now=now,
        )

    return cached(f"overview:{failures_window}", compute)


# --- stranded workflows -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSlot:
    """One line of a stranded group's plan: a step of the class (``step``), a gravestone
    (``removed``), or the missing step shown where it sat (``gap``; ``removed-gap`` when a
    gravestone marks the place)."""

    name: str
    kind: str


@dataclass(frozen=True)
class StrandedGroup:
    workflow_class: str
    step_name: str
    count: int
    class_known: bool
    runnable_steps: list[str]
    #: The class's steps in order with the missing step in the place it sat (empty when the
    #: class is not loaded).
    plan: list[PlanSlot] = field(default_factory=list)
    #: The runnable step right after the gap: what the Step select offers first.
    default_step: str | None = None


def is_stranded_step(type_name: str, step_name: str | None) -> bool:
    """Whether a paused workflow of ``type_name`` waits on a step its class no longer runs."""
    if not step_name:
        return False
    cls = workflow_class(type_name)
    definition = cls.steps.named(step_name) if cls is not None else None
    return definition is None or definition.removed


#: What the executor records when an execution names a step its class does not define.
STEP_NOT_DEFINED = "geneva_drive.errors.StepNotDefinedError"


def _latest_failed_not_defined(step_name: Any = None) -> Any:
    """The workflow's latest execution failed with StepNotDefinedError (on ``step_name``)."""
    later = aliased(StepExecution)
    condition = and_(
        StepExecution.workflow_id == Workflow.id,
        StepExecution.state == StepState.FAILED,
        StepExecution.error_class_name == STEP_NOT_DEFINED,
        ~exists(
            select(later.id).where(
                later.workflow_id == StepExecution.workflow_id, later.id > StepExecution.id
            )
        ),
    )
    if step_name is not None:
        condition = and_(condition, StepExecution.step_name == step_name)
    return exists(select(StepExecution.id).where(condition))


def _stranded_on(type_name: str, step_name: str) -> Any:
    """Paused workflows of ``type_name`` stranded on ``step_name`` (a step it does not run)."""
    if not type_name or not is_stranded_step(type_name, step_name):
        return Workflow.id.is_(None)  # not a missing step of that class: nothing is stranded
    return and_(
        Workflow.state == WorkflowState.PAUSED,
        or_(Workflow.next_step_name == step_name, _latest_failed_not_defined(step_name)),
    )


def stranded_groups(session: Session) -> list[StrandedGroup]:
    """Paused workflows grouped by (class, missing step).

    Two grouped passes over the paused rows (the ``(state, id)`` index): workflows whose latest
    execution failed with StepNotDefinedError, grouped by that execution's step; and the rest
    whose next step their class no longer runs (paused before the deploy; ``resume()`` refuses
    them). The "is it defined" test is the class's own step collection: no second step list.
    """
    counts: dict[tuple[str, str], int] = {}
    examples: dict[tuple[str, str], int] = {}
    later = aliased(StepExecution)
    by_error = session.execute(
        select(Workflow.type, StepExecution.step_name, func.count(), func.min(Workflow.id))
        .join(StepExecution, StepExecution.workflow_id == Workflow.id)
        .where(
            Workflow.state == WorkflowState.PAUSED,
            StepExecution.state == StepState.FAILED,
            StepExecution.error_class_name == STEP_NOT_DEFINED,
            ~exists(
                select(later.id).where(
                    later.workflow_id == StepExecution.workflow_id, later.id > StepExecution.id
                )
            ),
        )
        .group_by(Workflow.type, StepExecution.step_name)
    )
    for type_name, step_name, count, example in by_error:
        counts[(type_name, step_name)] = int(count)
        examples[(type_name, step_name)] = int(example)
    by_name = session.execute(
        select(Workflow.type, Workflow.next_step_name, func.count(), func.min(Workflow.id))
        .where(Workflow.state == WorkflowState.PAUSED, ~_latest_failed_not_defined())
        .group_by(Workflow.type, Workflow.next_step_name)
    )
    for type_name, next_step, count, example in by_name:
        if next_step is not None and is_stranded_step(type_name, next_step):
            key = (type_name, next_step)
            counts[key] = counts.get(key, 0) + int(count)
            examples.setdefault(key, int(example))
    groups = []
    for (type_name, step_name), count in counts.items():
        cls = workflow_class(type_name)
        plan, default = (
            _plan_with_gap(session, cls, step_name, examples[(type_name, step_name)])
            if cls is not None
            else ([], None)
        )
        groups.append(
            StrandedGroup(
                workflow_class=type_name,
                step_name=step_name,
                count=count,
                class_known=cls is not None,
                runnable_steps=[s.name for s in cls.steps.runnable] if cls is not None else [],
                plan=plan,
                default_step=default,
            )
        )
    return sorted(groups, key=lambda g: (-g.count, g.workflow_class, g.step_name))


#: Executions of the example workflow read to find the step the missing one came after.
_GAP_LOOKBACK = 20


def _plan_with_gap(
    session: Session, cls: Any, step_name: str, example_id: int
) -> tuple[list[PlanSlot], str | None]:
    """The class's plan with ``step_name`` shown where it sat, and the runnable step after it.

    A gravestone marks the place itself. A step deleted outright is no longer in the class, so
    its place is read from the history of one workflow of the group (the oldest): it came
    right after the last step that workflow ran before it (the start, when it ran none)."""
    slots = [PlanSlot(d.name, "removed" if d.removed else "step") for d in cls.steps]
    here = cls.steps.named(step_name)
    if here is not None:
        slots = [PlanSlot(s.name, "removed-gap") if s.name == here.name else s for s in slots]
        after = cls.steps.next_after(here.name)
        return slots, after.name if after is not None else None
    before = None
    for name in session.scalars(
        select(StepExecution.step_name)
        .where(StepExecution.workflow_id == example_id, StepExecution.step_name != step_name)
        .order_by(StepExecution.id.desc())
        .limit(_GAP_LOOKBACK)
    ):
        if cls.steps.named(name) is not None:
            before = cls.steps.named(name).name
            break
    index = 0 if before is None else cls.steps.index(before) + 1
    slots.insert(index, PlanSlot(step_name, "gap"))
    after = cls.steps.next_after(before)
    return slots, after.name if after is not None else None


# --- failures ----------------------------------------------------------------------------------

FAILURE_WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}


@dataclass(frozen=True)
class FailureGroup:
    workflow_class: str
    step_name: str
    error_class: str
    count: int
    last_failed_at: datetime | None
    last_message: str | None = None


def failure_groups(session: Session, window: timedelta, limit: int = 100) -> list[FailureGroup]:
    """Failed executions in ``window`` grouped by (class, step, error class), most first:
    rolled-up minutes from ``geneva_drive_execution_minutes``, the rest from the failed
    executions (:mod:`geneva_drive.rollups`), so a 7-day window costs what its minutes cost,
    not what its failures cost."""
    groups = rollups.failure_counts(session, utcnow() - window)[:limit]
    last_ids = [group.last_execution_id for group in groups]
    messages = dict(
        session.execute(
            select(StepExecution.id, StepExecution.error_message).where(
                StepExecution.id.in_(last_ids)
            )
        ).all()
    )
    return [
        FailureGroup(
            workflow_class=group.workflow_class,
            step_name=group.step_name,
            error_class=group.error_class or "(unknown)",
            count=group.count,
            last_failed_at=group.last_failed_at,
            last_message=messages.get(group.last_execution_id),
        )
        for group in groups
    ]


def _off_index(session: Session, column: Any) -> Any:
    """``column`` as SQLite's planner should not use an index for (a unary ``+``).

    SQLite, without statistics, prefers any index with an equality on state over a range
    of the index the query is written for, and then reads every row in that state (every
    failure ever). On SQLite that index is a full one on the range's column, which the
    state term must then leave alone; PostgreSQL's is partial and matched to the term.
    """
    return dialect_for(session).without_index(column)


def _aware(value: Any) -> datetime | None:
    """``max()`` over a column loses the UTC type decorator on SQLite; put the zone back."""
    from datetime import UTC

    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value  # type: ignore[no-any-return]


# --- signals -------------------------------------------------------------------------------------

INBOX_LIMIT = 200


def _signal_waiters(query: Any) -> Any:
    """``query`` narrowed to executions parked for a signal: ``waiting``, joined to their
    workflow, joins (``wait_for_children=True``) left out. The inbox lists these rows, and the
    overview's card counts them."""
    query = query.join(Workflow, Workflow.id == StepExecution.workflow_id).where(
        StepExecution.state == StepState.WAITING
    )
    joins = children.join_steps()
    if joins:
        query = query.where(~tuple_(Workflow.type, StepExecution.step_name).in_(joins))
    return query


def parked_executions(session: Session) -> list[tuple[StepExecution, Workflow]]:
    """Executions parked at a signal gate (bounded): those that time out soonest first (docs/MANUAL.md,
    "Time-bounded waits"), then those without a time-out, oldest first.

    A join (``wait_for_children=True``, docs/MANUAL.md, "Fan-out and join: child workflows") parks in ``waiting`` too, but waits for
    its children, not for a signal: left out here, so it neither shows as stranded nor
    takes a row of the limit from a real signal waiter.
    """
    rows = session.execute(
        _signal_waiters(select(StepExecution, Workflow))
        .order_by(
            StepExecution.timeout_at.is_(None),  # NULLs last on every backend
            StepExecution.timeout_at,
            StepExecution.waiting_since,
            StepExecution.id,
        )
        .limit(INBOX_LIMIT)
    ).all()
    return [(execution, workflow) for execution, workflow in rows]


def pending_signals(session: Session, limit: int = 100) -> list[Signal]:
    return list(
        session.scalars(
            select(Signal)
            .where(Signal.state == "pending")
            .order_by(Signal.created_at, Signal.id)
            .limit(limit)
        )
    )


#: How far back the inbox's "Recently timed out" section looks.
RECENT_TIMEOUTS_WINDOW = timedelta(days=7)


def recent_timeouts(
    session: Session, now: datetime | None = None, limit: int = 50
) -> list[tuple[StepExecution, Workflow]]:
    """The waits that timed out in the last :data:`RECENT_TIMEOUTS_WINDOW`, newest first, with
    their workflows (the partial index on ``timed_out_at``)."""
    since = (now or utcnow()) - RECENT_TIMEOUTS_WINDOW
    rows = session.execute(
        select(StepExecution, Workflow)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(StepExecution.timed_out_at.is_not(None), StepExecution.timed_out_at >= since)
        .order_by(StepExecution.timed_out_at.desc(), StepExecution.id.desc())
        .limit(limit)
    )
    return [(execution, workflow) for execution, workflow in rows]


def recent_signals(session: Session, limit: int = 50) -> list[Signal]:
    return list(session.scalars(select(Signal).order_by(Signal.id.desc()).limit(limit)))


# --- definitions ---------------------------------------------------------------------------------


def ongoing_per_step(session: Session, type_name: str) -> dict[str, int]:
    rows = session.execute(
        select(Workflow.next_step_name, func.count())
        .where(Workflow.type == type_name, Workflow.state.in_(list(ONGOING_WORKFLOW_STATES)))
        .group_by(Workflow.next_step_name)
    )
    return {str(name): int(count) for name, count in rows if name is not None}


#: The index of current executions by state (``(state, scheduled_for)``).
CURRENT_EXECUTIONS_INDEX = "index_geneva_drive_step_executions_scheduled"


def removed_steps_current(session: Session, cls: type[Workflow]) -> dict[str, int]:
    """``{gravestone_name: executions}``: the current (scheduled, waiting or in-progress)
    executions of ongoing ``cls`` workflows on each of its removed steps (the Definitions
    page's drain view).

    Unlike ``cls.removed_steps_in_flight()`` (the gem's count: every execution of ongoing
    workflows, history included, which at scale joins them to their whole history), this reads
    only current executions, executions first through the ``(state, scheduled_for)`` index:
    a cost that grows with the live set. Workflows paused on a gravestone with nothing current
    are the page's "ongoing" count (their next step), so the page says "safe to delete" only
    when both are zero.
    """
    names = [s.name for s in cls.steps.removed]
    if not names:
        return {}
    query = (
        select(StepExecution.step_name, func.count())
        .select_from(StepExecution)
        # ``cls`` itself: its mapper adds the polymorphic filter, subclasses included.
        .join(cls, cls.id == StepExecution.workflow_id)
        .where(
            StepExecution.state.in_(sorted(CURRENT_STEP_STATES)),
            StepExecution.step_name.in_(names),
            cls.state.in_(sorted(ONGOING_WORKFLOW_STATES)),
        )
        .group_by(StepExecution.step_name)
    )
    # MariaDB went workflows first instead: every ongoing workflow of the class, each probing
    # its executions (35 ms at 1M workflows, 10,000 ongoing; 8.5 ms executions first,
    # bench/NOTES.md).
    query = dialect_for(session).through_index(
        query, cast(Table, StepExecution.__table__), CURRENT_EXECUTIONS_INDEX
    )
    return {str(name): int(count) for name, count in session.execute(query)}


def definitions() -> dict[str, type[Workflow]]:
    return dict(sorted(registered_workflows().items()))


# --- hero, detail and audit ------------------------------------------------------------------------

HERO_LIMIT = 200


def hero_workflows(session: Session, hero_type: str, hero_id: str) -> list[Workflow]:
    return list(
        session.scalars(
            select(Workflow)
            .where(Workflow.hero_type == hero_type, Workflow.hero_id == hero_id)
            .order_by(Workflow.id.desc())
            .limit(HERO_LIMIT)
        )
    )


#: Executions per page of a workflow's timeline (a workflow with thousands of
#: executions rendered them all, 145 ms at 1,000; the database's part was about 1 ms).
TIMELINE_PAGE = 100


@dataclass(frozen=True)
class ExecutionPage:
    """One page of a workflow's executions, oldest first, and where the next older page ends."""

    executions: list[StepExecution]
    #: ``?before=`` of the next older page (the oldest execution shown), None when none is left.
    older: int | None
    #: The time range the page covers, for the signals and actions shown beside it.
    since: datetime | None
    until: datetime | None


def execution_page(
    session: Session, workflow_id: int, before: int | None = None, size: int = TIMELINE_PAGE
) -> ExecutionPage:
    """The newest ``size`` executions of a workflow older than execution ``before`` (keyset on
    ``(created_at, id)``, a range of ``index_geneva_drive_step_executions_on_workflow_created``).

    ``before`` that is not an execution of this workflow starts from the newest.
    """
    order = (StepExecution.created_at.desc(), StepExecution.id.desc())
    query = select(StepExecution).where(StepExecution.workflow_id == workflow_id)
    until: datetime | None = None
    if before is not None:
        until = session.scalar(
            select(StepExecution.created_at).where(
                StepExecution.id == before, StepExecution.workflow_id == workflow_id
            )
        )
        if until is not None:
            query = query.where(
                or_(
                    StepExecution.created_at < until,
                    and_(StepExecution.created_at == until, StepExecution.id < before),
                )
            )
    rows = list(session.scalars(query.order_by(*order).limit(size + 1)))
    more = len(rows) > size
    page = rows[:size]
    page.reverse()
    oldest = page[0] if page else None
    return ExecutionPage(
        executions=page,
        older=oldest.id if more and oldest is not None else None,
        since=oldest.created_at if more and oldest is not None else None,
        until=until,
    )


def latest_per_step(session: Session, workflow_id: int) -> list[StepExecution]:
    """The newest execution of each step of a workflow (the step plan's statuses)."""
    newest = (
        select(func.max(StepExecution.id))
        .where(StepExecution.workflow_id == workflow_id)
        .group_by(StepExecution.step_name)
    )
    return list(session.scalars(select(StepExecution).where(StepExecution.id.in_(newest))))


def executions_of(session: Session, workflow_id: int) -> list[StepExecution]:
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow_id)
            .order_by(StepExecution.created_at, StepExecution.id)
        )
    )


def _within(column: Any, since: datetime | None, until: datetime | None) -> list[Any]:
    terms = []
    if since is not None:
        terms.append(column >= since)
    if until is not None:
        terms.append(column < until)
    return terms


def signals_of(
    session: Session,
    workflow_id: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Signal]:
    """The workflow's signals, without its children's end reports (one per child, up to
    thousands: the children's progress line stands for them, docs/MANUAL.md, "Fan-out and join: child workflows")."""
    return list(
        session.scalars(
            select(Signal)
            .where(
                Signal.workflow_id == workflow_id,
                Signal.name != children.CHILD_ENDED,
                *_within(Signal.created_at, since, until),
            )
            .order_by(Signal.created_at, Signal.id)
        )
    )


def actions_of(
    session: Session,
    workflow_id: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[OperatorAction]:
    return list(
        session.scalars(
            select(OperatorAction)
            .where(
                OperatorAction.workflow_id == workflow_id,
                *_within(OperatorAction.created_at, since, until),
            )
            .order_by(OperatorAction.created_at, OperatorAction.id)
        )
    )


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    workflow: str = ""
    #: A bulk action's batch row: the rows it wrote for each of its workflows.
    batch: str = ""

    @classmethod
    def from_args(cls, args: Any) -> AuditFilters:
        return cls(
            actor=clean_text(args.get("actor", "")),
            action=clean_text(args.get("action", "")),
            workflow=clean_text(args.get("workflow", "")),
            batch=clean_text(args.get("batch", "")),
        )

    def as_params(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if v}


def audit_page(session: Session, filters: AuditFilters, after: Any, before: Any) -> Page:
    stmt = select(OperatorAction)
    if filters.actor:
        stmt = stmt.where(OperatorAction.actor == filters.actor)
    if filters.action:
        stmt = stmt.where(
            or_(
                OperatorAction.action == filters.action,
                OperatorAction.action == f"bulk_{filters.action}",
            )
        )
    workflow_id = parse_id(filters.workflow)
    if workflow_id is not None:
        stmt = stmt.where(OperatorAction.workflow_id == workflow_id)
    batch_id = parse_id(filters.batch)
    if filters.batch:
        # The batch row lists its workflows (done_ids, refused_ids, gone_ids); their rows
        # written after it are the batch's own (the workflow_id index, not a params scan).
        batch = session.get(OperatorAction, batch_id) if batch_id is not None else None
        params = (batch.params or {}) if batch is not None else {}
        ids = [
            int(i)
            for key in ("done_ids", "refused_ids", "gone_ids")
            for i in params.get(key) or []
            if isinstance(i, int)
        ]
        stmt = stmt.where(OperatorAction.workflow_id.in_(ids), OperatorAction.id > (batch_id or 0))
    limit = int(dashboard_config()["PAGE_SIZE"])
    return keyset_page(session, stmt, OperatorAction.id, after=after, before=before, limit=limit)
