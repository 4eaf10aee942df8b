"""Firing schedules: one workflow per tick, exactly once, under the schedule row's lock.

Every dispatcher sweep (:func:`geneva_drive.dispatch.dispatch_due`, so Celery beat's process,
``geneva-drive dispatcher`` and the embedded loop) calls :func:`fire_due`. Each due schedule
(``next_fire_at <= now``, not paused, not disabled) is handled in a transaction of its own that
locks its row (``SKIP LOCKED``: a row another dispatcher holds is that dispatcher's), reads it
again, creates the tick's workflow (metadata ``{"schedule": name, "tick": …}``) and advances
``next_fire_at`` in the same commit. So a tick creates its workflow once across any number of
dispatchers, and a tick that creates none is counted as skipped or missed on the row - never
lost in silence.

Missed ticks (a later tick is due too: every dispatcher was down) follow ``catch_up``: ``skip``
fires none, ``latest`` the most recent, ``all`` each one within ``catch_up_window``, oldest
first. A tick that comes while the schedule's previous workflow still goes on follows
``overlap``: ``skip`` (counted, with the reason), ``allow`` (created with ``allow_multiple``),
``cancel_previous`` (the previous one canceled first).

Schedules defined in code are written to their rows by :func:`reconcile`, at a dispatcher's
start and whenever the registered definitions change. A row whose class is loaded here but no
longer has that schedule is disabled (kept, shown, never fired); a row whose class this process
did not import is left alone, and this process does not fire it either (a dispatcher with only
some of the workflow modules must neither drop nor fire what it cannot see; the row shows late).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import db, registry
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import DuplicateWorkflowError, InvalidStateError
from geneva_drive.instrumentation import report_error, schedule_ticked
from geneva_drive.logsafe import escape
from geneva_drive.models import ScheduleRow, utcnow
from geneva_drive.recurrence import MAX_TICKS_PER_SWEEP, Schedule
from geneva_drive.workflow import Workflow, load_hero

log = logging.getLogger(__name__)

#: Due schedules read per query of a sweep.
FIRE_BATCH = 100
#: How often reconcile looks again when the registered definitions did not change.
RECONCILE_AGAIN_AFTER = 600.0
#: What became of a tick (the ``result`` label of ``geneva_drive_schedule_ticks_total``).
CREATED, SKIPPED_OVERLAP, MISSED, FAILED = "created", "skipped_overlap", "missed", "failed"


@dataclass
class FireReport:
    """What one :func:`fire_due` did: ticks by result."""

    created: int = 0
    skipped: int = 0
    missed: int = 0
    failed: int = 0


# --- code schedules -> rows -------------------------------------------------------------------


def code_schedules() -> dict[str, Schedule]:
    """The schedules of the registered classes (their own ``schedule``, not inherited)."""
    found: dict[str, Schedule] = {}
    for cls in registered_classes():
        schedule = cls.__dict__.get("schedule")
        if schedule is not None:
            found[schedule.name] = schedule
    return found


def registered_classes() -> list[type[Workflow]]:
    return list(registry.registered_workflows().values())


_reconciled: dict[str, Any] = {}


def reconcile(now: datetime | None = None, *, force: bool = False) -> None:
    """Write the code's schedules to their rows (new ones created, changed ones updated - a
    changed cadence starts from now - and ones removed from a loaded class disabled).

    Cheap when nothing changed: a fingerprint of the definitions is compared, and the rows are
    looked at again only every ``RECONCILE_AGAIN_AFTER`` seconds.
    """
    moment = now or utcnow()
    schedules = code_schedules()
    loaded = {cls.workflow_name for cls in registered_classes()}
    engine = db.get_engine()
    fingerprint = hashlib.sha256(
        repr(
            sorted(
                (
                    name,
                    s.workflow.workflow_name if s.workflow else "",
                    s.cron,
                    s.every,
                    s.timezone,
                    s.catch_up,
                    s.catch_up_window,
                    s.overlap,
                )
                for name, s in schedules.items()
            )
            + sorted(loaded)
        ).encode()
    ).hexdigest()
    key = (str(engine.url), id(engine), fingerprint)
    if (
        not force
        and _reconciled.get("key") == key
        and time.monotonic() - _reconciled["at"] < RECONCILE_AGAIN_AFTER
    ):
        return
    with db.transaction() as session:
        db.begin_write(session)
        rows = {
            row.name: row
            for row in session.scalars(select(ScheduleRow).where(ScheduleRow.source == "code"))
        }
        for name, schedule in schedules.items():
            assert schedule.workflow is not None
            row = rows.get(name)
            if row is None:
                taken = session.scalar(select(ScheduleRow.id).where(ScheduleRow.name == name))
                if taken is not None:
                    log.error(
                        "schedule %s of %s: a runtime schedule has that name; rename one of them",
                        name,
                        schedule.workflow.__name__,
                    )
                    continue
                session.add(
                    schedule.new_row(schedule.workflow.workflow_name, source="code", now=moment)
                )
                log.info("schedule %s created (%s)", name, schedule.describe())
                continue
            row.workflow_type = schedule.workflow.workflow_name
            schedule.write_to(row, moment)
            row.disabled_at = None
        for name, row in rows.items():
            if name not in schedules and row.workflow_type in loaded and row.disabled_at is None:
                row.disabled_at = moment
                log.warning(
                    "schedule %s is no longer in the code of %s: disabled (kept, never fired)",
                    name,
                    row.workflow_type,
                )
    _reconciled.update(key=key, at=time.monotonic())


# --- firing -------------------------------------------------------------------------------------


def fire_due(now: datetime | None = None, *, batch: int = FIRE_BATCH) -> FireReport:
    """Fire every due schedule (see the module docstring); return what became of the ticks."""
    moment = now or utcnow()
    report = FireReport()
    reconcile(moment)
    passed: set[int] = set()
    while True:
        with db.new_session() as session:
            query = (
                select(ScheduleRow.id)
                .where(
                    ScheduleRow.next_fire_at <= moment,
                    ScheduleRow.paused.is_(False),
                    ScheduleRow.disabled_at.is_(None),
                )
                .order_by(ScheduleRow.next_fire_at, ScheduleRow.id)
                .limit(batch + len(passed))
            )
            ids = [i for i in session.scalars(query) if i not in passed]
        if not ids:
            return report
        for schedule_id in ids:
            passed.add(schedule_id)
            try:
                _fire_one(schedule_id, moment, report)
            except Exception as error:
                log.exception("schedule %s could not fire", schedule_id)
                report_error(error, {"component": "schedules", "schedule_id": schedule_id})
        if len(ids) < batch:
            return report


def _fire_one(schedule_id: int, now: datetime, report: FireReport) -> None:
    events: list[tuple[str, str]] = []
    session = db.new_session()
    try:
        db.begin_write(session)
        query = select(ScheduleRow).where(ScheduleRow.id == schedule_id)
        row = session.scalars(dialect_for(session).lock(query, skip_locked=True)).first()
        if row is None or row.paused or row.disabled_at is not None or row.next_fire_at > now:
            session.rollback()  # fired by another dispatcher meanwhile, or paused
            return
        cls = registry.workflow_class(row.workflow_type)
        if cls is None:
            session.rollback()
            log.warning(
                "schedule %s: class %s is not loaded in this process (GENEVA_WORKFLOW_MODULES); "
                "left for a dispatcher that has it",
                row.name,
                row.workflow_type,
            )
            return
        definition = Schedule.from_row(row)
        due = _due_ticks(definition, row, now)
        fire, missed = _by_catch_up(definition, due, now)
        for tick in fire:
            result = _create_for_tick(session, row, cls, tick, now)
            events.append((row.name, result))
        if missed:
            row.ticks_missed += len(missed)
            row.last_missed_at = missed[-1]
            events.extend((row.name, MISSED) for _ in missed)
            log.warning(
                "schedule %s: %d tick(s) missed while no dispatcher ran (%s … %s; catch_up=%s)",
                row.name,
                len(missed),
                missed[0].isoformat(),
                missed[-1].isoformat(),
                row.catch_up,
            )
        row.last_tick_at = due[-1]
        row.next_fire_at = _next_after(definition, row, due[-1], now)
        session.commit()  # the after-commit hook sends the new workflows' first steps
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
    for name, result in events:
        if result == CREATED:
            report.created += 1
        elif result == MISSED:
            report.missed += 1
        elif result == FAILED:
            report.failed += 1
        else:
            report.skipped += 1
        if schedule_ticked.receivers:
            schedule_ticked.send("engine", schedule=name, result=result)


def _due_ticks(definition: Schedule, row: ScheduleRow, now: datetime) -> list[datetime]:
    """The ticks from ``next_fire_at`` up to ``now`` (at most MAX_TICKS_PER_SWEEP; the earliest
    ones beyond that are counted missed by catch_up's rules all the same)."""
    due = [row.next_fire_at]
    for tick in definition.ticks_after(row.next_fire_at, row.anchor_at):
        if tick > now:
            break
        due.append(tick)
        if len(due) > MAX_TICKS_PER_SWEEP:
            due.pop(0)
    return due


def _by_catch_up(
    definition: Schedule, due: list[datetime], now: datetime
) -> tuple[list[datetime], list[datetime]]:
    """(ticks to fire, ticks missed): a tick is missed when a later tick is due too."""
    if len(due) == 1:
        return due, []
    if definition.catch_up == "skip":
        return [], due
    if definition.catch_up == "latest":
        return due[-1:], due[:-1]
    window = definition.catch_up_window
    assert isinstance(window, timedelta)
    inside = [tick for tick in due if tick >= now - window]
    return inside, [tick for tick in due if tick < now - window]


def _next_after(definition: Schedule, row: ScheduleRow, last: datetime, now: datetime) -> datetime:
    for tick in definition.ticks_after(max(last, now), row.anchor_at):
        return tick
    raise AssertionError("a schedule has always a next tick")  # pragma: no cover


def _create_for_tick(
    session: Session, row: ScheduleRow, cls: type[Workflow], tick: datetime, now: datetime
) -> str:
    previous = session.get(Workflow, row.last_workflow_id) if row.last_workflow_id else None
    if previous is not None and previous.is_ongoing:
        if row.overlap == "skip":
            return _skipped(
                row, tick, f"the previous run, workflow #{previous.id}, is still {previous.state}"
            )
        if row.overlap == "cancel_previous":
            previous.cancel()
            log.info("schedule %s: canceled its previous run #%s", row.name, previous.id)
    try:
        hero = _hero(session, row, cls)
        with session.begin_nested():
            workflow = cls.create(
                hero=hero,
                session=session,
                allow_multiple=row.overlap == "allow",
                _metadata={"schedule": row.name, "tick": tick.isoformat()},
            )
    except DuplicateWorkflowError as error:
        return _skipped(row, tick, str(error))
    except Exception as error:
        report_error(error, {"component": "schedules", "schedule": row.name})
        _skipped(row, tick, f"{type(error).__name__}: {error}")
        return FAILED
    row.ticks_created += 1
    row.last_fired_at = now
    row.last_workflow_id = workflow.id
    log.info(
        "schedule %s: tick %s created %s #%s", row.name, tick.isoformat(), cls.__name__, workflow.id
    )
    return CREATED


def _skipped(row: ScheduleRow, tick: datetime, reason: str) -> str:
    row.ticks_skipped += 1
    row.last_skipped_at = tick
    row.last_skip_reason = escape(reason, 250)
    log.info("schedule %s: tick %s skipped: %s", row.name, tick.isoformat(), row.last_skip_reason)
    return SKIPPED_OVERLAP


def _hero(session: Session, row: ScheduleRow, cls: type[Workflow]) -> Any:
    if row.source == "runtime":
        return load_hero(session, row.hero_type, row.hero_id)
    schedule = cls.__dict__.get("schedule")
    source = getattr(schedule, "hero", None)
    return source(session) if callable(source) and not hasattr(source, "__table__") else source


# --- operators ---------------------------------------------------------------------------------


def named(session: Session, name: str, *, lock: bool = False) -> ScheduleRow:
    """The schedule row ``name``; LookupError naming the way to list them."""
    query = select(ScheduleRow).where(ScheduleRow.name == name)
    if lock:
        db.begin_write(session)
        query = dialect_for(session).lock(query)
    row = session.scalars(query).first()
    if row is None:
        raise LookupError(f"no schedule named {name!r}; `geneva-drive schedules list` shows them")
    return row


def pause(session: Session, name: str) -> ScheduleRow:
    """Stop firing (in the caller's transaction); its ticks are missed until resume."""
    row = named(session, name, lock=True)
    if row.paused:
        raise InvalidStateError(f"schedule {name!r} is paused already")
    row.paused = True
    return row


def resume(session: Session, name: str) -> ScheduleRow:
    """Fire again; the ticks missed while paused follow its catch_up at the next sweep."""
    row = named(session, name, lock=True)
    if not row.paused:
        raise InvalidStateError(f"schedule {name!r} is not paused")
    row.paused = False
    return row


def run_now(session: Session, name: str, now: datetime | None = None) -> Workflow:
    """Create one workflow of the schedule now (in the caller's transaction); ``next_fire_at``
    stays as it was. A previous run still going is canceled first under
    ``cancel_previous``, allowed beside under ``allow``, and refused under ``skip``."""
    moment = now or utcnow()
    row = named(session, name, lock=True)
    if row.disabled_at is not None:
        raise InvalidStateError(f"schedule {name!r} is disabled (removed from the code)")
    cls = registry.workflow_class(row.workflow_type)
    if cls is None:
        raise InvalidStateError(
            f"schedule {name!r}: class {row.workflow_type} is not loaded in this process"
        )
    previous = session.get(Workflow, row.last_workflow_id) if row.last_workflow_id else None
    if previous is not None and previous.is_ongoing and row.overlap == "skip":
        raise InvalidStateError(
            f"schedule {name!r}: its previous run, workflow #{previous.id}, is still "
            f"{previous.state} (overlap=skip); wait for it, or cancel it first"
        )
    result = _create_for_tick(session, row, cls, moment, moment)
    if result != CREATED:
        raise InvalidStateError(f"schedule {name!r}: {row.last_skip_reason}")
    workflow = session.get(Workflow, row.last_workflow_id)
    assert workflow is not None
    if schedule_ticked.receivers:
        schedule_ticked.send("engine", schedule=row.name, result=CREATED)
    return workflow
