"""Recurring work for the demo: schedules that fire while you watch the Schedules page.

:func:`install` adds four runtime schedules (``Schedule.create``; docs/MANUAL.md, "Recurring
work") once per database:

- ``queue-probe`` every 30 s: a two-step probe that finishes within a second;
- ``digest`` every minute, ``overlap="skip"``: its last step waits 75 s, so every other tick
  finds the previous digest still going and is recorded as skipped, with the reason;
- ``nightly-report`` at 03:00 Europe/Berlin: cron in words and fire times in two zones;
- ``weekly-export`` at 08:30 on Mondays in New York, paused: an operator's Resume to try.

Runtime rows rather than ``schedule =`` class attributes: importing this module (as every
process with ``GENEVA_WORKFLOW_MODULES=geneva_drive.examples`` does) then registers the classes
without writing schedule rows into whatever database that process uses.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select

from geneva_drive import Schedule, Workflow, db, step
from geneva_drive.examples._work import work
from geneva_drive.models import ScheduleRow

log = logging.getLogger(__name__)


class QueueProbeWorkflow(Workflow):
    """Looks at a queue's depth and records it: done within a second."""

    may_proceed_without_hero = True

    @step
    def probe(self) -> None:
        work()

    @step
    def record(self) -> None:
        work()


class DigestWorkflow(Workflow):
    """Gathers the minute's events, then sends them after a 75 s pause: longer than its
    schedule's minute, so the next tick is skipped (``overlap="skip"``)."""

    may_proceed_without_hero = True

    @step
    def gather(self) -> None:
        work()

    @step(wait=timedelta(seconds=75))
    def send(self) -> None:
        work()


class NightlyReportWorkflow(Workflow):
    """The night's report (one step)."""

    may_proceed_without_hero = True

    @step
    def compile(self) -> None:
        work()


#: name -> (workflow class, Schedule options, paused)
DEMO_SCHEDULES: dict[str, tuple[type[Workflow], dict[str, object], bool]] = {
    "queue-probe": (QueueProbeWorkflow, {"every": 30, "overlap": "allow"}, False),
    "digest": (DigestWorkflow, {"every": 60, "overlap": "skip"}, False),
    "nightly-report": (
        NightlyReportWorkflow,
        {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        False,
    ),
    "weekly-export": (
        NightlyReportWorkflow,
        {"cron": "30 8 * * MON", "timezone": "America/New_York", "catch_up": "skip"},
        True,
    ),
}


def install() -> int:
    """Add the demo schedules missing from the database; return how many were added."""
    added = 0
    with db.transaction() as session:
        existing = set(
            session.scalars(
                select(ScheduleRow.name).where(ScheduleRow.name.in_(list(DEMO_SCHEDULES)))
            )
        )
        for name, (cls, options, paused) in DEMO_SCHEDULES.items():
            if name in existing:
                continue
            row = Schedule.create(session, name, cls, **options)  # type: ignore[arg-type]
            row.paused = paused
            added += 1
    if added:
        log.info("added %d demo schedules", added)
    return added
