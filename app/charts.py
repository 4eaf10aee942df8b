"""Trend charts: step executions completed / failed / reattempted per minute (last hour) and
per hour (last day), overall and per class; per-step duration distributions.

Server-rendered SVG (``templates/_charts.html``): no script, nothing inline for the CSP to
refuse, colours from the stylesheet. The counts come from the per-minute rollup that
housekeeping keeps (:mod:`geneva_drive.rollups`) and, for the minutes it has not rolled up yet,
from the executions grouped over the ``finished_at`` index range: never a scan of the whole
history, and not of a whole day's executions either.

A bucket that ended more than :data:`SETTLE_AFTER` ago cannot change any more (an execution's
``finished_at`` is the time it finished), so each app reads it once and keeps its counts
(:func:`_bucket_counts`); a render then reads only the last few minutes. Without that, the day
chart's query grows with a day's activity: 815 ms at 70,000 executions a day (bench/NOTES.md,
an earlier review).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from geneva_drive import rollups
from geneva_drive.dashboard.formatting import duration
from geneva_drive.dashboard.queries import cached
from geneva_drive.dialects import Dialect, dialect_for
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import StepState
from geneva_drive.workflow import Workflow

KINDS = rollups.KINDS
#: Width and height of a chart's plot area (SVG user units; the SVG scales to its box).
WIDTH, HEIGHT = 600.0, 80.0


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    #: (kind, y, height) from the bottom up: completed, reattempted, failed.
    segments: list[tuple[str, float, float]]
    title: str
    #: The current bucket, still filling ("45 after 34 s" beside full minutes of 74).
    partial: bool = False
    #: Taller than the scale: drawn to the top with a marker, its count in the title.
    clipped: bool = False


@dataclass(frozen=True)
class Tick:
    """A mark on the time axis: its x (plot units) and its label (UTC clock time)."""

    x: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    total: dict[str, int]
    peak: int
    bars: list[Bar]
    first_label: str
    last_label: str
    #: The time axis: evenly spaced ticks from the window's start to its end.
    ticks: list[Tick] = field(default_factory=list)
    #: The top of the y scale (executions per bucket); below ``peak`` when a spike is clipped.
    scale_max: int = 0
    #: "minute" or "hour": the unit of one bar.
    unit: str = "minute"

    @property
    def summary(self) -> str:
        return ", ".join(f"{self.total[k]:,} {k}" for k in KINDS)

    @property
    def clipped(self) -> int:
        return sum(1 for bar in self.bars if bar.clipped)


@dataclass(frozen=True)
class Trend:
    """One window (last hour by minute, last day by hour): overall and per class."""

    name: str
    overall: Chart
    per_class: list[tuple[str, Chart]]


def _bucket(column: Any, seconds: int, dialect: Dialect) -> Any:
    """Seconds since the epoch of ``column``, integer-divided by ``seconds``."""
    return func.floor(dialect.epoch_seconds(column) / seconds)


def _counts(
    session: Session, since: datetime, seconds: int, until: datetime | None = None
) -> dict[tuple[str, int, str], int]:
    """``{(class, bucket, kind): n}`` for executions that finished since ``since`` (and
    before ``until``): rolled-up minutes from ``geneva_drive_execution_minutes``, the rest
    from the executions (:mod:`geneva_drive.rollups`)."""
    found: dict[tuple[str, int, str], int] = rollups.chart_counts(session, since, seconds, until)
    return found


#: A bucket that ended this long ago is settled: no execution finishes into it any more (the
#: rollup's definition, which explains the margin).
SETTLE_AFTER = rollups.SETTLE_AFTER

_settled_lock = threading.Lock()


def _bucket_counts(
    session: Session, seconds: int, first: int, count: int, now: datetime
) -> dict[tuple[str, int, str], int]:
    """The counts of buckets ``first .. first + count - 1``: settled ones read once per app
    and kept (``app.extensions``), the rest read now."""
    from flask import current_app

    def start(number: int) -> datetime:
        return datetime.fromtimestamp(number * seconds, tz=UTC)

    settled_before = math.floor((now - SETTLE_AFTER).timestamp() / seconds)
    store: dict[int, dict[int, dict[tuple[str, str], int]]] = current_app.extensions.setdefault(
        "geneva_drive.settled_chart_buckets", {}
    )
    with _settled_lock:
        kept = store.setdefault(seconds, {})
        for number in [n for n in kept if n < first]:
            del kept[number]  # out of the window for good
        missing = [n for n in range(first, min(first + count, settled_before)) if n not in kept]
    if missing:
        read = _counts(session, start(missing[0]), seconds, until=start(missing[-1] + 1))
        fresh: dict[int, dict[tuple[str, str], int]] = {
            n: {} for n in range(missing[0], missing[-1] + 1)
        }
        for (cls, number, kind), n in read.items():
            fresh[number][(cls, kind)] = n
        with _settled_lock:
            kept.update(fresh)
    live_from = max(first, settled_before)
    found = _counts(session, start(live_from), seconds)
    with _settled_lock:
        for number in range(first, live_from):
            for (cls, kind), n in kept.get(number, {}).items():
                found[(cls, number, kind)] = n
    return found


#: A bar taller than this many times the next tallest is a spike: the scale ignores it.
SPIKE_FACTOR = 3.0


def robust_scale(values: list[int]) -> int:
    """The top of the y scale: the tallest bar, unless it towers over the rest (a startup
    burst of 4,000 beside minutes of 40 would flatten every other bar to a pixel). Then the
    scale is 1.5 times the second tallest and the spike is drawn clipped, with a marker."""
    ordered = sorted((v for v in values if v > 0), reverse=True)
    if not ordered:
        return 0
    # A seeding burst spans a few minutes of the hour chart, not one bar: the spike is the
    # few tallest bars (up to a quarter of the bars with any count) that tower over the rest.
    for spikes in range(1, max(1, len(ordered) // 4) + 1):
        if spikes < len(ordered) and ordered[spikes - 1] > SPIKE_FACTOR * ordered[spikes]:
            return max(1, math.ceil(ordered[spikes] * 1.5))
    return ordered[0]


#: Ticks per window: the time axis gets this many intervals.
TICK_INTERVALS = 6


def _chart(
    title: str,
    per_bucket: dict[int, dict[str, int]],
    first: int,
    count: int,
    seconds: int,
    now: datetime | None = None,
) -> Chart:
    sums = [sum(per_bucket.get(first + i, {}).values()) for i in range(count)]
    peak = max(sums or [0])
    top = robust_scale(sums)
    scale = HEIGHT / top if top else 0.0
    slot = WIDTH / count
    unit = "minute" if seconds == 60 else "hour"
    bars = []
    totals = dict.fromkeys(KINDS, 0)
    for i in range(count):
        values = per_bucket.get(first + i, {})
        total = sums[i]
        clipped = total > top > 0
        # A clipped bar keeps its proportions, squeezed into the full height.
        factor = HEIGHT / total if clipped else scale
        y = HEIGHT
        segments = []
        for kind in ("completed", "reattempted", "failed"):
            n = values.get(kind, 0)
            totals[kind] += n
            if n:
                height = max(n * factor, 1.0)
                y -= height
                segments.append((kind, round(y, 2), round(height, 2)))
        start = datetime.fromtimestamp((first + i) * seconds, tz=UTC)
        label = ", ".join(f"{values.get(k, 0)} {k}" for k in KINDS)
        partial = i == count - 1
        note = ""
        if partial:
            elapsed = int((now or utcnow()).timestamp()) - (first + i) * seconds
            note = f" (this {unit} so far: {duration(max(0, elapsed))} of it)"
        if clipped:
            note += f" (off the scale: {total:,}, the scale stops at {top:,})"
        bars.append(
            Bar(
                x=round(i * slot, 2),
                width=round(slot * 0.8, 2),
                segments=segments,
                title=f"{start:%H:%M} UTC: {label}{note}",
                partial=partial,
                clipped=clipped,
            )
        )
    step = max(1, count // TICK_INTERVALS)
    # The right edge is the end of the current bucket, still ahead (16:00 at 15:20 on the day
    # chart): it is labelled "now", where the window ends, not with a time yet to come.
    ticks = [
        Tick(
            x=round(i * slot, 2),
            label="now"
            if i == count
            else f"{datetime.fromtimestamp((first + i) * seconds, tz=UTC):%H:%M}",
        )
        for i in range(0, count + 1, step)
    ]
    short = "min" if seconds == 60 else "h"
    return Chart(
        title=title,
        total=totals,
        peak=peak,
        bars=bars,
        first_label=f"{count} {short} ago",
        last_label="now",
        ticks=ticks,
        scale_max=top,
        unit=unit,
    )


WINDOWS = {"last hour, per minute": (60, 60), "last day, per hour": (3600, 24)}


def trends(session: Session, now: datetime | None = None) -> list[Trend]:
    """Both windows, overall and per class (cached for ``COUNTS_CACHE_SECONDS``)."""
    now = now or utcnow()

    def compute() -> list[Trend]:
        result = []
        for name, (seconds, count) in WINDOWS.items():
            last = math.floor(now.timestamp() / seconds)
            first = last - count + 1
            counts = _bucket_counts(session, seconds, first, count, now)
            overall: dict[int, dict[str, int]] = {}
            by_class: dict[str, dict[int, dict[str, int]]] = {}
            for (cls, number, kind), n in counts.items():
                slot = overall.setdefault(number, {})
                slot[kind] = slot.get(kind, 0) + n
                by_class.setdefault(cls, {}).setdefault(number, {})[kind] = n
            result.append(
                Trend(
                    name=name,
                    overall=_chart("All classes", overall, first, count, seconds, now),
                    per_class=[
                        (cls, _chart(cls, values, first, count, seconds, now))
                        for cls, values in sorted(by_class.items())
                    ],
                )
            )
        return result

    return cached("trends", compute)


# --- per-step durations (definition page) ------------------------------------------------------

#: Upper bounds (seconds) of the duration buckets; the last bucket is open.
DURATION_BOUNDS = (0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0)
#: Most recent completed executions per class read for the distribution.
DURATION_SAMPLE = 5000


@dataclass(frozen=True)
class Distribution:
    step_name: str
    count: int
    p50: str
    p95: str
    #: (label, n, bar width 0..100) per bucket.
    buckets: list[tuple[str, int, float]]


#: Short enough to sit under an 80-unit bar at the SVG's small font.
BUCKET_LABELS = (
    "< 10 ms",
    "10-100 ms",
    "0.1-1 s",
    "1-10 s",
    "10-60 s",
    "1-10 min",
    "10-60 min",
    "\u2265 1 h",
)


def _bucket_labels() -> list[str]:
    assert len(BUCKET_LABELS) == len(DURATION_BOUNDS) + 1
    return list(BUCKET_LABELS)


#: The index the duration histograms read: completed executions newest first.
DURATIONS_INDEX = "ix_geneva_drive_step_executions_finished_at"


def durations(session: Session, workflow_type: str, window: timedelta) -> list[Distribution]:
    """Duration histograms per step of one class: executions completed within ``window``,
    at most :data:`DURATION_SAMPLE` of them (the newest), through the ``finished_at`` index."""
    since = utcnow() - window
    query = (
        select(StepExecution.step_name, StepExecution.started_at, StepExecution.finished_at)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.finished_at >= since,
            StepExecution.state == StepState.COMPLETED,
            Workflow.type == workflow_type,
            StepExecution.started_at.is_not(None),
        )
        .order_by(StepExecution.finished_at.desc())
        .limit(DURATION_SAMPLE)
    )
    # MariaDB took the in-progress index (its ``started_at`` and a state column) instead and
    # sorted every completed execution: 9.8 s at 1M workflows (bench/NOTES.md).
    query = dialect_for(session).through_index(
        query, cast(Table, StepExecution.__table__), DURATIONS_INDEX
    )
    rows = session.execute(query).all()
    per_step: dict[str, list[float]] = {}
    for step_name, started, finished in rows:
        if started is not None and finished is not None:
            per_step.setdefault(step_name, []).append((finished - started).total_seconds())
    labels = _bucket_labels()
    result = []
    for step_name, values in sorted(per_step.items()):
        values.sort()
        counts = [0] * len(labels)
        for value in values:
            index = next(
                (i for i, bound in enumerate(DURATION_BOUNDS) if value < bound),
                len(DURATION_BOUNDS),
            )
            counts[index] += 1
        top = max(counts)
        result.append(
            Distribution(
                step_name=step_name,
                count=len(values),
                p50=duration(values[len(values) // 2]),
                p95=duration(values[min(len(values) - 1, math.ceil(len(values) * 0.95) - 1)]),
                buckets=[
                    (label, n, round(100 * n / top, 1) if top else 0.0)
                    for label, n in zip(labels, counts, strict=True)
                ],
            )
        )
    return result
