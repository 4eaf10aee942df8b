"""Trend charts: step executions completed / failed / reattempted per minute (last hour) and
per hour (last day), overall and per class; per-step duration distributions.

Server-rendered SVG (``templates/_charts.html``): no script, nothing inline for the CSP to
refuse, colours from the stylesheet. The counts are grouped in the database over the
``finished_at`` index range of the window (one query per window, cached like the overview's
counts), never a scan of the whole history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Integer, case, cast, func, literal, literal_column, select
from sqlalchemy.orm import Session

from geneva_drive.dashboard.formatting import duration
from geneva_drive.dashboard.queries import cached
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import Outcome, StepState
from geneva_drive.workflow import Workflow

KINDS = ("completed", "failed", "reattempted")
#: Width and height of a chart's plot area (SVG user units; the SVG scales to its box).
WIDTH, HEIGHT = 600.0, 80.0


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    #: (kind, y, height) from the bottom up: completed, reattempted, failed.
    segments: list[tuple[str, float, float]]
    title: str


@dataclass(frozen=True)
class Chart:
    title: str
    total: dict[str, int]
    peak: int
    bars: list[Bar]
    first_label: str
    last_label: str

    @property
    def summary(self) -> str:
        return ", ".join(f"{self.total[k]:,} {k}" for k in KINDS)


@dataclass(frozen=True)
class Trend:
    """One window (last hour by minute, last day by hour): overall and per class."""

    name: str
    overall: Chart
    per_class: list[tuple[str, Chart]]


def _bucket(column: Any, seconds: int, dialect: str) -> Any:
    """Seconds since the epoch of ``column``, integer-divided by ``seconds``."""
    epoch: Any
    if dialect == "sqlite":
        epoch = cast(func.strftime("%s", column), Integer)
    elif dialect == "postgresql":
        epoch = cast(func.floor(func.extract("epoch", column)), Integer)
    else:  # MySQL / MariaDB: the column holds UTC; no session time zone involved
        epoch = func.timestampdiff(literal_column("SECOND"), literal("1970-01-01 00:00:00"), column)
    return func.floor(epoch / seconds)


def _counts(session: Session, since: datetime, seconds: int) -> dict[tuple[str, int, str], int]:
    """``{(class, bucket, kind): n}`` for executions that finished since ``since``."""
    dialect = session.get_bind().dialect.name
    kind = case(
        (StepExecution.state == StepState.FAILED, "failed"),
        (StepExecution.outcome == Outcome.REATTEMPTED, "reattempted"),
        (StepExecution.state == StepState.COMPLETED, "completed"),
        else_=None,
    ).label("kind")
    bucket = _bucket(StepExecution.finished_at, seconds, dialect).label("bucket")
    rows = select(Workflow.type.label("cls"), bucket, kind).join(
        Workflow, Workflow.id == StepExecution.workflow_id
    )
    inner = rows.where(StepExecution.finished_at >= since).subquery()
    grouped = select(inner.c.cls, inner.c.bucket, inner.c.kind, func.count()).group_by(
        inner.c.cls, inner.c.bucket, inner.c.kind
    )
    found: dict[tuple[str, int, str], int] = {}
    for cls, number, name, n in session.execute(grouped):
        if name is not None and number is not None:
            found[(str(cls), int(number), str(name))] = int(n)
    return found


def _chart(
    title: str, per_bucket: dict[int, dict[str, int]], first: int, count: int, seconds: int
) -> Chart:
    peak = max([sum(v.values()) for v in per_bucket.values()] or [0])
    scale = HEIGHT / peak if peak else 0.0
    slot = WIDTH / count
    bars = []
    totals = dict.fromkeys(KINDS, 0)
    for i in range(count):
        values = per_bucket.get(first + i, {})
        y = HEIGHT
        segments = []
        for kind in ("completed", "reattempted", "failed"):
            n = values.get(kind, 0)
            totals[kind] += n
            if n:
                height = max(n * scale, 1.0)
                y -= height
                segments.append((kind, round(y, 2), round(height, 2)))
        start = datetime.fromtimestamp((first + i) * seconds, tz=UTC)
        label = ", ".join(f"{values.get(k, 0)} {k}" for k in KINDS)
        bars.append(
            Bar(
                x=round(i * slot, 2),
                width=round(slot * 0.8, 2),
                segments=segments,
                title=f"{start:%H:%M} UTC: {label}",
            )
        )
    unit = "min" if seconds == 60 else "h"
    return Chart(
        title=title,
        total=totals,
        peak=peak,
        bars=bars,
        first_label=f"{count} {unit} ago",
        last_label="now",
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
            since = datetime.fromtimestamp(first * seconds, tz=UTC)
            counts = _counts(session, since, seconds)
            overall: dict[int, dict[str, int]] = {}
            by_class: dict[str, dict[int, dict[str, int]]] = {}
            for (cls, number, kind), n in counts.items():
                slot = overall.setdefault(number, {})
                slot[kind] = slot.get(kind, 0) + n
                by_class.setdefault(cls, {}).setdefault(number, {})[kind] = n
            result.append(
                Trend(
                    name=name,
                    overall=_chart("All classes", overall, first, count, seconds),
                    per_class=[
                        (cls, _chart(cls, values, first, count, seconds))
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


def durations(session: Session, workflow_type: str, window: timedelta) -> list[Distribution]:
    """Duration histograms per step of one class: executions completed within ``window``,
    at most :data:`DURATION_SAMPLE` of them (the newest), through the ``finished_at`` index."""
    since = utcnow() - window
    rows = session.execute(
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
    ).all()
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
