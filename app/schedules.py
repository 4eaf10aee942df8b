"""The schedules an operator sees: the ``/schedules`` page and ``geneva-drive schedules``.

One read, :func:`schedules_view`, for both: every row of ``geneva_drive_schedules`` (up to
:data:`LIMIT`) with its cadence in words (:meth:`geneva_drive.Schedule.describe`), its next
three fire times in its own time zone and in UTC, its last run with that workflow's state, and
what became of its ticks (skipped, with the last reason; missed). The cadence, the tick
arithmetic and the firing are the engine's (engine/recurrence.py, engine/schedules.py); this
module only reads and words them. docs/MANUAL.md, "Recurring work", is the user's guide.

The actions (Pause, Resume, Run now) are :func:`geneva_drive.operator_actions.perform_schedule`;
:func:`controls` says which ones a schedule offers, and why one is held back.

No Flask here: the command runs where ``import flask`` fails (app/operator_cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import lateness, registry
from geneva_drive.dashboard.presenters import state_badge
from geneva_drive.errors import ScheduleError
from geneva_drive.models import ScheduleRow, utcnow
from geneva_drive.operator_actions import schedule_state
from geneva_drive.recurrence import Schedule
from geneva_drive.states import ONGOING_WORKFLOW_STATES
from geneva_drive.workflow import Workflow

#: The most schedules one page lists (the soonest to fire first); more are cut, and it says so.
LIMIT = 500
#: Fire times shown per schedule.
NEXT_TIMES = 3
#: The badge tone of each schedule state (the word itself is always shown).
STATE_TONES = {"active": "ok", "paused": "warn", "disabled": "muted"}
#: Display order: the schedules that fire, then those an operator stopped, then the removed.
STATE_ORDER = {"active": 0, "paused": 1, "disabled": 2}


@dataclass(frozen=True)
class FireTime:
    """One coming tick: the instant (UTC) and how it reads in the schedule's time zone."""

    at: datetime
    local: str


@dataclass(frozen=True)
class LastRun:
    """The workflow the schedule created last (``state`` None: deleted since, by retention)."""

    workflow_id: int
    workflow_class: str
    state: str | None

    @property
    def tone(self) -> str:
        return state_badge(self.state).tone if self.state else "muted"


@dataclass(frozen=True)
class ScheduleControl:
    """A button of a schedule's row: the action (its audit name), its label, the confirm
    question and button, or why it is held back (``disabled``)."""

    action: str
    label: str
    confirm: str
    confirm_label: str
    disabled: str = ""


@dataclass(frozen=True)
class ScheduleRowView:
    """One schedule as the page and the command show it."""

    id: int
    name: str
    workflow_type: str
    #: "At 03:00", "every 30 s" (the engine's words), and the raw cron or interval.
    description: str
    cadence: str
    timezone: str
    catch_up: str
    overlap: str
    source: str
    hero_type: str | None
    hero_id: str | None
    #: ``active``, ``paused`` or ``disabled`` (removed from the code: shown, never fired).
    state: str
    disabled_at: datetime | None
    next_fire_at: datetime
    #: How far ``next_fire_at`` is past the overdue grace of an active schedule, else None.
    late_by: timedelta | None
    next_times: list[FireTime]
    last_fired_at: datetime | None
    last_run: LastRun | None
    ticks_created: int
    ticks_skipped: int
    last_skipped_at: datetime | None
    last_skip_reason: str | None
    ticks_missed: int
    last_missed_at: datetime | None
    #: False when this process has no class of that name (Run now needs it).
    class_loaded: bool
    controls: list[ScheduleControl] = field(default_factory=list)

    @property
    def state_tone(self) -> str:
        return STATE_TONES.get(self.state, "muted")

    @property
    def anchor(self) -> str:
        """The row's fragment id (``#schedule-12``): ids, not names, which may hold ``/``."""
        return f"schedule-{self.id}"


@dataclass(frozen=True)
class SchedulesView:
    """Every row of the page, and the figures above it."""

    rows: list[ScheduleRowView]
    #: True when more than :data:`LIMIT` schedules exist (the latest to fire are left off).
    truncated: bool
    taken_at: datetime

    def count(self, state: str) -> int:
        return sum(1 for row in self.rows if row.state == state)

    @property
    def late(self) -> list[ScheduleRowView]:
        return [row for row in self.rows if row.late_by is not None]


def schedules_view(
    session: Session, now: datetime | None = None, *, can_act: bool = False
) -> SchedulesView:
    """Every schedule (at most :data:`LIMIT`, the soonest to fire first), with its last run;
    ``can_act`` adds the operator's buttons. Two queries: the schedules, their last runs."""
    now = now or utcnow()
    rows = list(
        session.scalars(
            select(ScheduleRow).order_by(ScheduleRow.next_fire_at, ScheduleRow.id).limit(LIMIT + 1)
        )
    )
    truncated = len(rows) > LIMIT
    rows = rows[:LIMIT]
    runs = _last_runs(session, [r.last_workflow_id for r in rows if r.last_workflow_id])
    views = [_row_view(row, runs, now, can_act) for row in rows]
    views.sort(key=lambda v: (STATE_ORDER.get(v.state, 3), v.next_fire_at, v.name))
    return SchedulesView(views, truncated, now)


def _last_runs(session: Session, ids: list[int]) -> dict[int, tuple[str, str]]:
    if not ids:
        return {}
    found = session.execute(
        select(Workflow.id, Workflow.type, Workflow.state).where(Workflow.id.in_(ids))
    )
    return {int(i): (str(t), str(s)) for i, t, s in found}


def _row_view(
    row: ScheduleRow, runs: dict[int, tuple[str, str]], now: datetime, can_act: bool
) -> ScheduleRowView:
    definition = Schedule.from_row(row)
    state = schedule_state(row)
    last_run = None
    if row.last_workflow_id:
        workflow_class, run_state = runs.get(row.last_workflow_id, (row.workflow_type, None))
        last_run = LastRun(row.last_workflow_id, workflow_class, run_state)
    late_by = None
    if state == "active" and row.next_fire_at < lateness.overdue_cutoff(now):
        late_by = now - row.next_fire_at
    loaded = registry.workflow_class(row.workflow_type) is not None
    view = ScheduleRowView(
        id=row.id,
        name=row.name,
        workflow_type=row.workflow_type,
        description=definition.describe(),
        cadence=cadence(row),
        timezone=row.timezone,
        catch_up=row.catch_up,
        overlap=row.overlap,
        source=row.source,
        hero_type=row.hero_type,
        hero_id=row.hero_id,
        state=state,
        disabled_at=row.disabled_at,
        next_fire_at=row.next_fire_at,
        late_by=late_by,
        next_times=next_times(definition, row),
        last_fired_at=row.last_fired_at,
        last_run=last_run,
        ticks_created=row.ticks_created,
        ticks_skipped=row.ticks_skipped,
        last_skipped_at=row.last_skipped_at,
        last_skip_reason=row.last_skip_reason,
        ticks_missed=row.ticks_missed,
        last_missed_at=row.last_missed_at,
        class_loaded=loaded,
    )
    if can_act:
        view.controls.extend(controls(view))
    return view


def cadence(row: ScheduleRow) -> str:
    """The schedule as written: its cron expression, or ``every 30 s``."""
    if row.cron is not None:
        return row.cron
    return f"every {row.every_seconds or 0:g} s"


def next_fire_times(definition: Schedule, row: ScheduleRow, n: int = NEXT_TIMES) -> list[datetime]:
    """The next ``n`` ticks as the dispatcher will see them: ``next_fire_at`` (due now when it
    is past), then the ticks after it (``every=`` ticks on the row's anchor)."""
    times = [row.next_fire_at]
    try:
        ticks = definition.ticks_after(row.next_fire_at, row.anchor_at)
        times.extend(next(ticks) for _ in range(n - 1))
    except ScheduleError:  # a zone this Python does not know: the stored tick alone
        pass
    return times


def next_times(definition: Schedule, row: ScheduleRow) -> list[FireTime]:
    """:func:`next_fire_times` with each one worded in the schedule's zone."""
    try:
        zone: Any = definition.zone()
    except ScheduleError:
        zone = UTC
    return [
        FireTime(at, local_text(at, zone, row.timezone)) for at in next_fire_times(definition, row)
    ]


def local_text(at: datetime, zone: Any, name: str) -> str:
    """``2026-12-08 03:00 Europe/Berlin`` (the zone's abbreviation in brackets when it has one
    that says more than the name: ``(CET)``)."""
    local = at.astimezone(zone)
    abbreviation = local.tzname() or ""
    text = f"{local:%Y-%m-%d %H:%M} {name}"
    if abbreviation and abbreviation != name and not abbreviation.startswith(("+", "-")):
        text += f" ({abbreviation})"
    return text


def controls(view: ScheduleRowView) -> list[ScheduleControl]:
    """The operator's buttons for ``view``: Pause or Resume, and Run now; none for a disabled
    schedule. Run now is held back, with why, where the engine would refuse it."""
    if view.state == "disabled":
        return []
    name = view.name
    found: list[ScheduleControl] = []
    if view.state == "paused":
        found.append(
            ScheduleControl(
                "schedule_resume",
                "Resume",
                f"Resume schedule {name}? Ticks missed while it was paused follow "
                f"catch_up={view.catch_up} at the next sweep.",
                f"Resume schedule {name}",
            )
        )
    else:
        found.append(
            ScheduleControl(
                "schedule_pause",
                "Pause",
                f"Pause schedule {name}? It creates no workflow until resumed; its ticks "
                "meanwhile count as missed.",
                f"Pause schedule {name}",
            )
        )
    found.append(
        ScheduleControl(
            "schedule_run_now",
            "Run now",
            f"Run schedule {name} now? It creates one {view.workflow_type} workflow; the next "
            "tick stays when it was.",
            f"Run {name} now",
            disabled=run_now_refusal(view),
        )
    )
    return found


def run_now_refusal(view: ScheduleRowView) -> str:
    """Why Run now would be refused ("" when it would not): the class is not loaded here, or
    the previous run still goes on under ``overlap="skip"``."""
    if not view.class_loaded:
        return f"{view.workflow_type} is not loaded in the dashboard (GENEVA_WORKFLOW_MODULES)"
    run = view.last_run
    if view.overlap == "skip" and run is not None and run.state in ONGOING_WORKFLOW_STATES:
        return f"its previous run, #{run.workflow_id}, is still {run.state} (overlap=skip)"
    return ""


@dataclass(frozen=True)
class ScheduleOrigin:
    """What a workflow's detail page says of the schedule that created it."""

    name: str
    tick: datetime | None
    #: The tick in the schedule's zone (the UTC time when the schedule is gone).
    tick_text: str
    #: The schedule's row on /schedules (``schedule-12``); "" when the schedule is gone.
    anchor: str = ""


def origin(session: Session, workflow: Workflow) -> ScheduleOrigin | None:
    """The schedule a workflow was created for (its metadata ``{"schedule", "tick"}``), with the
    tick worded in that schedule's zone; None for a workflow no schedule created."""
    metadata = workflow.metadata_ or {}
    name = metadata.get("schedule")
    if not isinstance(name, str) or not name:
        return None
    tick: datetime | None = None
    raw = metadata.get("tick")
    if isinstance(raw, str):
        try:
            tick = datetime.fromisoformat(raw)
        except ValueError:
            tick = None
    if tick is not None and tick.tzinfo is None:
        tick = tick.replace(tzinfo=UTC)
    found = session.execute(
        select(ScheduleRow.id, ScheduleRow.timezone).where(ScheduleRow.name == name)
    ).first()
    anchor = f"schedule-{found[0]}" if found else ""
    if tick is None:
        return ScheduleOrigin(name, None, "", anchor)
    timezone: str | None = found[1] if found else None
    zone: Any = UTC
    if timezone:
        try:
            zone = Schedule(every=60, timezone=timezone).zone()
        except ScheduleError:
            timezone = None
    return ScheduleOrigin(name, tick, local_text(tick, zone, timezone or "UTC"), anchor)


def as_dict(row: ScheduleRowView, now: datetime) -> dict[str, object]:
    """One row for ``--json`` (times as ISO 8601 UTC)."""
    return {
        "name": row.name,
        "workflow_class": row.workflow_type,
        "description": row.description,
        "cadence": row.cadence,
        "timezone": row.timezone,
        "catch_up": row.catch_up,
        "overlap": row.overlap,
        "source": row.source,
        "hero_type": row.hero_type,
        "hero_id": row.hero_id,
        "state": row.state,
        "disabled_at": _iso(row.disabled_at),
        "next_fire_at": row.next_fire_at.isoformat(),
        "late_seconds": round(row.late_by.total_seconds(), 1) if row.late_by else 0.0,
        "next_fire_times": [{"utc": t.at.isoformat(), "local": t.local} for t in row.next_times],
        "last_fired_at": _iso(row.last_fired_at),
        "last_run": (
            {
                "workflow_id": row.last_run.workflow_id,
                "workflow_class": row.last_run.workflow_class,
                "state": row.last_run.state,
            }
            if row.last_run
            else None
        ),
        "ticks_created": row.ticks_created,
        "ticks_skipped": row.ticks_skipped,
        "last_skipped_at": _iso(row.last_skipped_at),
        "last_skip_reason": row.last_skip_reason,
        "ticks_missed": row.ticks_missed,
        "last_missed_at": _iso(row.last_missed_at),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
