"""Step executions finished per minute, rolled up, for the charts and the failures page
(an earlier review).

The dashboard's trend charts (the last hour by minute, the last day by hour) and its failure
groups (the last hour, day or week) count the executions that finished in their window, per
workflow class. Counted from the executions, that costs what the window's traffic costs: a
join of every execution in it to its workflow (543 ms for the failures of 7 days at 1M
workflows and 100,000 a day on PostgreSQL). ``geneva_drive_execution_minutes`` holds the same
counts per minute and (class, step, kind, error class), a few rows a minute whatever the
traffic.

**Writing.** :func:`roll_up`, a housekeeping phase, counts the executions of each *settled*
minute (one that ended more than :data:`SETTLE_AFTER` ago: ``finished_at`` is written once, when
an execution closes, so no execution finishes into it any more; the margin covers a worker
whose clock is behind and a transaction that committed late) into that table, and moves the
mark (``geneva_drive_rollup_marks``) past it in the same transaction, under the mark's row
lock: two passes never count a minute twice, and a pass that fails counts nothing. The first
pass starts :data:`RETAIN` ago; rows older than that are deleted as the mark moves on. A pass
reads at most :data:`CHUNK_MINUTES` minutes per transaction, through the ``finished_at`` index.

**Hours.** Once every minute of an hour is rolled up, the same pass sums the hour's minutes
into ``geneva_drive_execution_hours`` (``minute`` is then the hour's first) under the
:data:`HOURS_MARK`, so the failures page's 7 days read 168 rows per group rather than 10,080
(30 ms at 1M workflows on MariaDB, bench/NOTES.md).

**Reading.** :func:`chart_counts` and :func:`failure_counts` split a window into the hours
summed (read from the hours, where the buckets are whole hours), the minutes rolled up (read
from the minutes) and the rest (read from the executions, as before: the window's ragged
first minute, the minutes since the mark, and everything when housekeeping has not run yet).
The counts are exact either way; the tables only make them cheaper.

Executions deleted later (housekeeping's cleanup, the archive) stay counted in the minutes
they finished in: the charts show what ran, not what is kept.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Table,
    and_,
    case,
    cast,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from geneva_drive import db
from geneva_drive.dialects import Dialect, dialect_for
from geneva_drive.models import Base, StepExecution, utcnow
from geneva_drive.states import Outcome, StepState

log = logging.getLogger(__name__)

#: A minute that ended this long ago is settled: no execution finishes into it any more.
SETTLE_AFTER = timedelta(minutes=5)
#: How long rolled-up minutes are kept: the failures page's longest window (7 days) and a day.
RETAIN = timedelta(days=8)
#: Minutes one roll-up transaction counts (the first pass after an upgrade has 8 days to count).
CHUNK_MINUTES = 360
#: The mark's row in ``geneva_drive_rollup_marks``.
MARK = "execution_minutes"
#: The hours' mark: ``[from_minute, until_minute)``, whole hours, is summed into the hours.
HOURS_MARK = "execution_hours"

KINDS = ("completed", "failed", "reattempted")

_minutes: Table = Base.metadata.tables["geneva_drive_execution_minutes"]
_hours: Table = Base.metadata.tables["geneva_drive_execution_hours"]
_marks: Table = Base.metadata.tables["geneva_drive_rollup_marks"]
_executions: Table = StepExecution.__table__  # type: ignore[assignment]
_workflows: Table = Base.metadata.tables["geneva_drive_workflows"]

#: What an execution counts as: failed, reattempted or completed; None (canceled, skipped, or
#: still running) is not counted.
KIND = case(
    (_executions.c.state == StepState.FAILED, "failed"),
    (_executions.c.outcome == Outcome.REATTEMPTED, "reattempted"),
    (_executions.c.state == StepState.COMPLETED, "completed"),
    else_=None,
)


def minute_of(moment: datetime) -> int:
    """Whole minutes since 1970-01-01 UTC of ``moment`` (the minute it falls in)."""
    return math.floor(moment.timestamp() / 60)


def start_of(minute: int) -> datetime:
    return datetime.fromtimestamp(minute * 60, tz=UTC)


def _minute(column: Any, dialect: Dialect) -> Any:
    return cast(func.floor(dialect.epoch_seconds(column) / 60), BigInteger)


# --- writing -----------------------------------------------------------------------------------


def roll_up(now: datetime | None = None) -> int:
    """Count every settled minute not rolled up yet into ``geneva_drive_execution_minutes``;
    returns the number of executions counted. One transaction per :data:`CHUNK_MINUTES`."""
    moment = now or utcnow()
    settled = minute_of(moment - SETTLE_AFTER)  # the first minute that is not settled
    oldest = minute_of(moment - RETAIN)
    counted = 0
    while True:
        with db.transaction() as session:
            db.begin_write(session)  # SQLite: the write lock serializes passes (no row locks)
            dialect = dialect_for(session)
            connection = session.connection()
            dialect.lock_or_create(connection, _marks, "name", MARK)
            mark = connection.execute(
                select(_marks.c.from_minute, _marks.c.until_minute).where(_marks.c.name == MARK)
            ).one()
            begin = max(oldest, mark.until_minute if mark.until_minute is not None else oldest)
            if begin >= settled:
                break
            end = min(begin + CHUNK_MINUTES, settled)
            counted += _count_minutes(connection, dialect, begin, end)
            kept_from = max(oldest, mark.from_minute if mark.from_minute is not None else begin)
            if mark.until_minute is not None and begin > mark.until_minute:
                # The mark fell behind RETAIN (housekeeping stopped for over 8 days): the
                # minutes in between were never counted, so the rolled range restarts here.
                kept_from = begin
            connection.execute(
                update(_marks)
                .where(_marks.c.name == MARK)
                .values(from_minute=kept_from, until_minute=end)
            )
            connection.execute(delete(_minutes).where(_minutes.c.minute < kept_from))
            log.info(
                "rolled up %d executions finished in minutes %s to %s",
                counted,
                start_of(begin).isoformat(),
                start_of(end).isoformat(),
            )
    _sum_hours()
    return counted


def _sum_hours() -> None:
    """Sum every hour whose minutes are all rolled up and not summed yet into the hours, and
    drop the hours the minutes no longer keep: one transaction, under the hours' mark."""
    with db.transaction() as session:
        db.begin_write(session)
        dialect = dialect_for(session)
        connection = session.connection()
        dialect.lock_or_create(connection, _marks, "name", HOURS_MARK)
        marks = {
            row.name: row
            for row in connection.execute(
                select(_marks.c.name, _marks.c.from_minute, _marks.c.until_minute).where(
                    _marks.c.name.in_([MARK, HOURS_MARK])
                )
            )
        }
        minutes, hours = marks.get(MARK), marks[HOURS_MARK]
        if minutes is None or minutes.from_minute is None or minutes.until_minute is None:
            return
        first = _whole_hour_up(minutes.from_minute)  # the minutes hold this hour whole
        end = _whole_hour_down(minutes.until_minute)
        if hours.until_minute is not None and hours.until_minute >= first:
            begin, kept_from = hours.until_minute, max(first, hours.from_minute or first)
        else:  # never summed, or the minutes restarted past the hours (a long stop)
            begin = kept_from = first
        if begin < end:
            _count_hours(connection, begin, end)
        connection.execute(
            update(_marks)
            .where(_marks.c.name == HOURS_MARK)
            .values(from_minute=kept_from, until_minute=max(begin, end))
        )
        connection.execute(delete(_hours).where(_hours.c.minute < kept_from))


def _whole_hour_up(minute: int) -> int:
    return -(-minute // 60) * 60


def _whole_hour_down(minute: int) -> int:
    return minute // 60 * 60


def _count_hours(connection: Any, begin: int, end: int) -> None:
    """INSERT the sums of the minutes ``[begin, end)`` (whole hours) per hour."""
    hour = (cast(func.floor(_minutes.c.minute / 60), BigInteger) * 60).label("hour")
    rows = (
        select(
            hour,
            _minutes.c.type,
            _minutes.c.step_name,
            _minutes.c.kind,
            _minutes.c.error_class_name,
            _minutes.c.count,
            _minutes.c.last_finished_at,
            _minutes.c.last_execution_id,
        )
        .where(_minutes.c.minute >= begin, _minutes.c.minute < end)
        .subquery()
    )
    columns = ("type", "step_name", "kind", "error_class_name")
    summed = select(
        rows.c.hour,
        *(rows.c[name] for name in columns),
        func.sum(rows.c.count),
        func.max(rows.c.last_finished_at),
        func.max(rows.c.last_execution_id),
    ).group_by(rows.c.hour, *(rows.c[name] for name in columns))
    connection.execute(
        _hours.insert().from_select(
            ["minute", *columns, "count", "last_finished_at", "last_execution_id"], summed
        )
    )


def _count_minutes(connection: Any, dialect: Dialect, begin: int, end: int) -> int:
    """INSERT the counts of minutes ``[begin, end)`` from the executions; returns how many
    executions they count."""
    kind = KIND.label("kind")
    rows = (
        select(
            _minute(_executions.c.finished_at, dialect).label("minute"),
            _workflows.c.type.label("type"),
            _executions.c.step_name.label("step_name"),
            kind,
            case(
                (
                    _executions.c.state == StepState.FAILED,
                    func.coalesce(_executions.c.error_class_name, literal("")),
                ),
                else_=literal(""),
            ).label("error"),
            _executions.c.finished_at.label("finished_at"),
            _executions.c.id.label("id"),
        )
        .join(_workflows, _workflows.c.id == _executions.c.workflow_id)
        .where(
            _executions.c.finished_at >= start_of(begin),
            _executions.c.finished_at < start_of(end),
        )
        .subquery()
    )
    grouped = (
        select(
            rows.c.minute,
            rows.c.type,
            rows.c.step_name,
            rows.c.kind,
            rows.c.error,
            func.count(),
            func.max(rows.c.finished_at),
            func.max(rows.c.id),
        )
        .where(rows.c.kind.is_not(None))
        .group_by(rows.c.minute, rows.c.type, rows.c.step_name, rows.c.kind, rows.c.error)
    )
    values = [
        {
            "minute": int(minute),
            "type": type_name,
            "step_name": step_name,
            "kind": kind_name,
            "error_class_name": error,
            "count": int(n),
            "last_finished_at": last_at,
            "last_execution_id": int(last_id),
        }
        for minute, type_name, step_name, kind_name, error, n, last_at, last_id in connection.execute(
            grouped
        )
    ]
    if values:
        connection.execute(_minutes.insert(), values)
    return sum(value["count"] for value in values)


# --- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Split:
    """A window ``[since, until)`` cut into rolled-up ranges (per table, its ranges of
    ``minute``) and ranges read live from the executions."""

    rolled: list[tuple[Table, list[tuple[int, int]]]]
    live: list[tuple[datetime, datetime | None]]


def _split(
    session: Session, since: datetime, until: datetime | None, *, hourly: bool = False
) -> _Split:
    """``hourly``: the caller's buckets are whole hours, so summed hours may serve."""
    marks = {
        row.name: row
        for row in session.execute(
            select(_marks.c.name, _marks.c.from_minute, _marks.c.until_minute).where(
                _marks.c.name.in_([MARK, HOURS_MARK])
            )
        )
    }
    mark = marks.get(MARK)
    if mark is None or mark.from_minute is None or mark.until_minute is None:
        return _Split([], [(since, until)])
    first = max(math.ceil(since.timestamp() / 60), mark.from_minute)
    end = mark.until_minute if until is None else min(minute_of(until), mark.until_minute)
    if first >= end:
        return _Split([], [(since, until)])
    live: list[tuple[datetime, datetime | None]] = []
    if since < start_of(first):
        live.append((since, start_of(first)))
    if until is None or start_of(end) < until:
        live.append((start_of(end), until))
    rolled: list[tuple[Table, list[tuple[int, int]]]] = [(_minutes, [(first, end)])]
    hours = marks.get(HOURS_MARK)
    if (
        hourly
        and hours is not None
        and hours.from_minute is not None
        and hours.until_minute is not None
    ):
        begin = max(_whole_hour_up(first), hours.from_minute)
        stop = min(_whole_hour_down(end), hours.until_minute)
        if begin < stop:
            edges = [(a, b) for a, b in ((first, begin), (stop, end)) if a < b]
            rolled = [(_hours, [(begin, stop)])] + ([(_minutes, edges)] if edges else [])
    return _Split(rolled, live)


def _rolled_range(table: Table, ranges: list[tuple[int, int]]) -> Any:
    return or_(*(and_(table.c.minute >= a, table.c.minute < b) for a, b in ranges))


def _live_range(column: Any, ranges: list[tuple[datetime, datetime | None]]) -> Any:
    return or_(
        *(
            and_(column >= since, column < until) if until is not None else column >= since
            for since, until in ranges
        )
    )


def chart_counts(
    session: Session, since: datetime, seconds: int, until: datetime | None = None
) -> dict[tuple[str, int, str], int]:
    """``{(class, bucket, kind): n}`` for executions that finished in ``[since, until)``;
    ``bucket`` is whole ``seconds`` since the epoch (a multiple of 60)."""
    dialect = dialect_for(session)
    split = _split(session, since, until, hourly=seconds % 3600 == 0)
    found: dict[tuple[str, int, str], int] = {}

    def add(rows: Any) -> None:
        for cls, number, name, n in session.execute(rows):
            if name is not None and number is not None:
                key = (str(cls), int(number), str(name))
                found[key] = found.get(key, 0) + int(n)

    for table, ranges in split.rolled:
        inner = (
            select(
                table.c.type.label("cls"),
                cast(func.floor(table.c.minute * 60 / seconds), BigInteger).label("bucket"),
                table.c.kind.label("kind"),
                table.c.count.label("n"),
            )
            .where(_rolled_range(table, ranges))
            .subquery()
        )
        add(
            select(inner.c.cls, inner.c.bucket, inner.c.kind, func.sum(inner.c.n)).group_by(
                inner.c.cls, inner.c.bucket, inner.c.kind
            )
        )
    if split.live:
        bucket = cast(
            func.floor(dialect.epoch_seconds(_executions.c.finished_at) / seconds), BigInteger
        )
        inner = (
            select(
                _workflows.c.type.label("cls"),
                bucket.label("bucket"),
                KIND.label("kind"),
            )
            .join(_workflows, _workflows.c.id == _executions.c.workflow_id)
            .where(_live_range(_executions.c.finished_at, split.live))
            .subquery()
        )
        add(
            select(inner.c.cls, inner.c.bucket, inner.c.kind, func.count()).group_by(
                inner.c.cls, inner.c.bucket, inner.c.kind
            )
        )
    return found


@dataclass(frozen=True)
class FailureCount:
    workflow_class: str
    step_name: str
    error_class: str | None
    count: int
    last_failed_at: datetime | None
    #: The newest failed execution of the group (its message, while the row is kept).
    last_execution_id: int


def failure_counts(session: Session, since: datetime) -> list[FailureCount]:
    """Failed executions since ``since``, grouped by (class, step, error class), most first."""
    dialect = dialect_for(session)
    split = _split(session, since, None, hourly=True)
    groups: dict[tuple[str, str, str], list[Any]] = {}

    def add(rows: Any) -> None:
        for cls, step_name, error, n, last_at, last_id in session.execute(rows):
            key = (str(cls), str(step_name), error or "")
            last = _aware(last_at)
            group = groups.setdefault(key, [0, None, 0])
            group[0] += int(n)
            if last is not None and (group[1] is None or last > group[1]):
                group[1] = last
            group[2] = max(group[2], int(last_id))

    for table, ranges in split.rolled:
        add(
            select(
                table.c.type,
                table.c.step_name,
                table.c.error_class_name,
                func.sum(table.c.count),
                func.max(table.c.last_finished_at),
                func.max(table.c.last_execution_id),
            )
            .where(_rolled_range(table, ranges), table.c.kind == "failed")
            .group_by(table.c.type, table.c.step_name, table.c.error_class_name)
        )
    if split.live:
        add(
            select(
                _workflows.c.type,
                _executions.c.step_name,
                _executions.c.error_class_name,
                func.count(),
                func.max(_executions.c.failed_at),
                func.max(_executions.c.id),
            )
            .join(_workflows, _workflows.c.id == _executions.c.workflow_id)
            # The failed_at index (partial on failed rows; SQLite: see without_index) holds
            # only failures: each range is a range of it, whatever the history behind it.
            # failed_at is finished_at for a failed execution (geneva_drive.transitions).
            .where(
                dialect.without_index(_executions.c.state) == StepState.FAILED,
                _live_range(_executions.c.failed_at, split.live),
            )
            .group_by(_workflows.c.type, _executions.c.step_name, _executions.c.error_class_name)
        )
    ordered = sorted(groups.items(), key=lambda item: (-item[1][0], item[0]))
    return [
        FailureCount(
            workflow_class=cls,
            step_name=step_name,
            error_class=error or None,
            count=n,
            last_failed_at=last_at,
            last_execution_id=last_id,
        )
        for (cls, step_name, error), (n, last_at, last_id) in ordered
    ]


def _aware(value: Any) -> datetime | None:
    """``max()`` over a column loses the UTC type decorator on SQLite; put the zone back."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value  # type: ignore[no-any-return]
