"""Schedules: recurring workflows, exactly once per tick (docs/MANUAL.md, "Recurring work").

Each test defines its scheduled classes inside a fixture and forgets them afterwards: a class
with a schedule is registered for the whole process, and another test's dispatcher sweep would
otherwise write its row too. Time is the ``now`` handed to ``fire_schedules``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from geneva_drive import Schedule, Workflow, db, schedules, step
from geneva_drive.errors import InvalidStateError, StepConfigurationError
from geneva_drive.models import ScheduleRow
from geneva_drive.testing import fire_schedules
from geneva_drive.workflow import unregister
from tests.engine.helpers import make_order

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def define() -> Iterator[Callable[..., type[Workflow]]]:
    """``define(name, schedule, steps=1)``: a workflow class with that schedule, forgotten
    (and its definition cache cleared) when the test ends."""
    made: list[str] = []

    def make(name: str, schedule: Schedule | None, *, hero_less: bool = True) -> type[Workflow]:
        body: dict[str, Any] = {
            "__module__": __name__,
            "may_proceed_without_hero": hero_less,
            "work": step(lambda self: None),
        }
        if schedule is not None:
            body["schedule"] = schedule
        cls = type(name, (Workflow,), body)
        made.append(name)
        return cls

    yield make
    for name in made:
        unregister(name)
    schedules._reconciled.clear()


def _row(name: str) -> ScheduleRow:
    with db.new_session() as session:
        row = session.scalars(select(ScheduleRow).where(ScheduleRow.name == name)).one()
        session.expunge(row)
        return row


def _runs(cls: type[Workflow]) -> list[Workflow]:
    with db.new_session() as session:
        found = list(
            session.scalars(
                select(Workflow).where(Workflow.type == cls.workflow_name).order_by(Workflow.id)
            )
        )
        session.expunge_all()
        return found


def _start(cls: type[Workflow], at: datetime) -> None:
    """The code's schedules written as a dispatcher starting at ``at`` would."""
    schedules.reconcile(at, force=True)


# --- definitions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron="),
        ({"cron": "0 3 * * *", "every": 60}, "exactly one of cron="),
        ({"cron": "61 3 * * *"}, "is not a five-field cron expression"),
        ({"cron": "0 3 * *"}, "is not a five-field cron expression"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "is not an IANA time zone"),
        ({"cron": "0 3 * * *", "catch_up": "some"}, "catch_up='some': use one of skip, latest"),
        ({"every": 60, "overlap": "queue"}, "overlap='queue': use one of skip, allow"),
        ({"every": 0.5}, "every= must be at least 1 s"),
        ({"every": 60, "name": "no spaces allowed"}, "name='no spaces allowed'"),
    ],
)
def test_an_invalid_schedule_is_refused_when_the_class_is_defined(define, options, message):
    with pytest.raises(StepConfigurationError, match=message.replace("(", r"\(")) as refused:
        define("BadSchedule", Schedule(**options))
    assert "BadSchedule.schedule" in str(refused.value)


def test_an_invalid_runtime_schedule_is_a_value_error(geneva_session, define):
    cls = define("RuntimeTarget", None)
    with pytest.raises(ValueError, match="is not an IANA time zone"):
        Schedule.create(geneva_session, "report:1", cls, cron="0 3 * * *", timezone="Nowhere/X")
    Schedule.create(geneva_session, "report:1", cls, every=3600)
    with pytest.raises(ValueError, match="exists already"):
        Schedule.create(geneva_session, "report:1", cls, every=60)


def test_next_fire_times_are_aware_utc_in_the_schedules_zone():
    nightly = Schedule(cron="0 3 * * *", timezone="Europe/Berlin")
    times = nightly.next_fire_times(3, after=T0)
    assert times == [
        datetime(2026, 6, 2, 1, 0, tzinfo=UTC),  # 03:00 CEST
        datetime(2026, 6, 3, 1, 0, tzinfo=UTC),
        datetime(2026, 6, 4, 1, 0, tzinfo=UTC),
    ]
    assert Schedule(cron="@hourly").next_fire_times(1, after=T0) == [T0 + timedelta(hours=1)]
    assert Schedule(cron="30 8 * * MON").describe() == "At 08:30 on Monday"


# --- reconciling the code's schedules --------------------------------------------------------------


def test_code_schedules_are_written_updated_and_disabled_never_deleted(geneva_session, define):
    cls = define("Nightly", Schedule(cron="0 3 * * *", timezone="UTC"))
    _start(cls, T0)
    row = _row("Nightly")
    assert (row.source, row.workflow_type, row.next_fire_at) == (
        "code",
        "Nightly",
        datetime(2026, 6, 2, 3, 0, tzinfo=UTC),
    )
    # A deploy changes the cron: the row follows, from the time of the change.
    unregister("Nightly")
    define("Nightly", Schedule(cron="0 5 * * *"))
    schedules.reconcile(T0 + timedelta(hours=1))
    assert _row("Nightly").next_fire_at == datetime(2026, 6, 2, 5, 0, tzinfo=UTC)
    # A deploy removes it from the (loaded) class: disabled, kept, never fired.
    unregister("Nightly")
    cls = define("Nightly", None)
    schedules.reconcile(T0 + timedelta(hours=2))
    row = _row("Nightly")
    assert row.disabled_at is not None
    assert fire_schedules(T0 + timedelta(days=3)).created == 0
    assert _runs(cls) == []
    # A process that did not load the class neither disables nor fires its schedule.
    define("Other", Schedule(every=3600))
    _start(None, T0)
    unregister("Other")
    schedules.reconcile(T0 + timedelta(hours=3))
    assert _row("Other").disabled_at is None
    assert fire_schedules(T0 + timedelta(days=1)).created == 0
    assert _row("Other").next_fire_at == T0 + timedelta(hours=1)  # left for a dispatcher with it


# --- exactly once ----------------------------------------------------------------------------------


def test_a_tick_creates_its_workflow_once_with_dispatchers_racing(geneva_session, define):
    cls = define(
        "Racing",
        Schedule(every=60, catch_up="all", catch_up_window=timedelta(hours=1), overlap="allow"),
    )
    _start(cls, T0)
    now = T0 + timedelta(minutes=5, seconds=30)  # five ticks due
    barrier = threading.Barrier(4)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def dispatcher() -> None:
        try:
            barrier.wait(10)
            reports.append(fire_schedules(now))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=dispatcher) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    runs = _runs(cls)
    ticks = [run.metadata_["tick"] for run in runs]
    assert len(ticks) == len(set(ticks)) == 5  # each tick once, whoever fired it
    assert sum(r.created for r in reports) == 5
    assert all(run.metadata_["schedule"] == "Racing" for run in runs)
    row = _row("Racing")
    assert (row.ticks_created, row.next_fire_at) == (5, T0 + timedelta(minutes=6))


# --- catch-up after an outage --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [
        ("skip", [], 4),
        ("latest", ["2026-06-01T16:00:00+00:00"], 3),
        ("all", ["2026-06-01T15:00:00+00:00", "2026-06-01T16:00:00+00:00"], 2),
    ],
)
def test_missed_ticks_follow_catch_up(geneva_session, define, policy, fired, missed):
    """Every dispatcher down from 12:00 to 16:30: the 13, 14, 15 and 16 o'clock ticks are due
    at once. ``all`` fires those within its 2 h window, oldest first."""
    cls = define(
        "Hourly",
        Schedule(
            cron="0 * * * *", catch_up=policy, catch_up_window=timedelta(hours=2), overlap="allow"
        ),
    )
    _start(cls, T0)
    report = fire_schedules(T0 + timedelta(hours=4, minutes=30))
    assert [run.metadata_["tick"] for run in _runs(cls)] == fired
    row = _row("Hourly")
    assert (report.missed, row.ticks_missed) == (missed, missed)
    assert row.next_fire_at == datetime(2026, 6, 1, 17, 0, tzinfo=UTC)
    # Nothing is fired twice by the next sweep.
    assert fire_schedules(T0 + timedelta(hours=4, minutes=31)).created == 0


def test_a_paused_schedule_fires_nothing_and_catches_up_on_resume(geneva_session, define):
    cls = define("Pausable", Schedule(every=3600, catch_up="latest"))
    _start(cls, T0)
    schedules.pause(geneva_session, "Pausable")
    geneva_session.commit()
    assert fire_schedules(T0 + timedelta(hours=3, minutes=1)).created == 0
    with pytest.raises(InvalidStateError, match="paused already"):
        schedules.pause(geneva_session, "Pausable")
    geneva_session.rollback()
    schedules.resume(geneva_session, "Pausable")
    geneva_session.commit()
    report = fire_schedules(T0 + timedelta(hours=3, minutes=2))
    assert (report.created, report.missed) == (1, 2)
    assert [r.metadata_["tick"] for r in _runs(cls)] == ["2026-06-01T15:00:00+00:00"]


# --- overlap -----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["skip", "allow", "cancel_previous"])
def test_a_tick_while_the_previous_run_goes_on_follows_overlap(geneva_session, define, policy):
    cls = define("Overlapping", Schedule(every=60, overlap=policy))
    _start(cls, T0)
    assert fire_schedules(T0 + timedelta(seconds=61)).created == 1
    report = fire_schedules(T0 + timedelta(seconds=121))  # the first run has not run yet
    runs = _runs(cls)
    row = _row("Overlapping")
    if policy == "skip":
        assert (report.created, report.skipped, len(runs)) == (0, 1, 1)
        assert row.ticks_skipped == 1 and f"workflow #{runs[0].id}" in row.last_skip_reason
    elif policy == "allow":
        assert (report.created, len(runs)) == (1, 2)
        assert all(run.state == "ready" for run in runs)
    else:
        assert (report.created, len(runs)) == (1, 2)
        assert [run.state for run in runs] == ["canceled", "ready"]
    assert row.next_fire_at == T0 + timedelta(seconds=180)


# --- time zones and daylight saving -----------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "cron", "after", "expected_local"),
    [
        # Spring forward: 02:30 does not exist; it fires once, at the end of the gap (03:00).
        ("Europe/Berlin", "30 2 * * *", "2026-03-28T12:00", ["2026-03-29T03:00+02:00"]),
        ("America/New_York", "30 2 * * *", "2026-03-07T12:00", ["2026-03-08T03:00-04:00"]),
        # Fall back: 02:30 (Berlin) / 01:30 (New York) happen twice; it fires once, the first.
        ("Europe/Berlin", "30 2 * * *", "2026-10-24T12:00", ["2026-10-25T02:30+02:00"]),
        ("America/New_York", "30 1 * * *", "2026-10-31T12:00", ["2026-11-01T01:30-04:00"]),
    ],
)
def test_daylight_saving_changes_fire_once(
    geneva_session, define, zone, cron, after, expected_local
):
    cls = define("Dst", Schedule(cron=cron, timezone=zone, overlap="allow", catch_up="all"))
    start = datetime.fromisoformat(after).replace(tzinfo=Schedule(timezone=zone, every=1).zone())
    _start(cls, start.astimezone(UTC))
    fire_schedules(start.astimezone(UTC) + timedelta(hours=20))  # the night, and past it
    runs = _runs(cls)
    fired = [datetime.fromisoformat(run.metadata_["tick"]) for run in runs]
    assert [t.astimezone(start.tzinfo).isoformat(timespec="minutes") for t in fired] == (
        expected_local
    )


# --- runtime schedules and run now ------------------------------------------------------------


def test_a_runtime_schedule_fires_for_its_hero_and_run_now_leaves_the_next_tick(
    geneva_session, define
):
    cls = define("WeeklyReport", None, hero_less=False)
    account = make_order(geneva_session, "acme")
    row = Schedule.create(
        geneva_session,
        "report:acme",
        cls,
        hero=account,
        cron="30 8 * * MON",
        timezone="America/New_York",
    )
    geneva_session.commit()
    new_york = ZoneInfo("America/New_York")
    monday = row.next_fire_at  # the first Monday 08:30 in New York after its creation
    assert row.source == "runtime"
    assert monday.astimezone(new_york).strftime("%a %H:%M") == "Mon 08:30"
    assert fire_schedules(monday - timedelta(seconds=1)).created == 0
    assert fire_schedules(monday + timedelta(seconds=30)).created == 1
    [run] = _runs(cls)
    assert (run.hero_type, run.hero_id) == ("Order", str(account.id))
    next_tick = _row("report:acme").next_fire_at
    assert next_tick.astimezone(new_york).strftime("%a %H:%M") == "Mon 08:30"
    assert timedelta(days=6) < next_tick - monday < timedelta(days=8)

    # Run now: overlap="skip" refuses while the previous run goes on, then creates one.
    with pytest.raises(InvalidStateError, match=f"workflow #{run.id}, is still ready"):
        schedules.run_now(geneva_session, "report:acme")
    geneva_session.rollback()
    geneva_session.get(Workflow, run.id).cancel()
    geneva_session.commit()
    made = schedules.run_now(geneva_session, "report:acme")
    geneva_session.commit()
    assert made.metadata_["schedule"] == "report:acme"
    assert _row("report:acme").next_fire_at == next_tick
    with db.new_session() as session:
        total = session.scalar(select(func.count()).select_from(ScheduleRow))
    assert total == 1
