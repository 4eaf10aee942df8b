"""The demo's schedules: added once per database, and firing while you watch - the probe every
30 s, the digest every minute with every other tick skipped while the previous digest waits,
the nightly report at 03:00 Berlin time, and a paused weekly export."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select

from geneva_drive import db
from geneva_drive.examples import recurring
from geneva_drive.models import ScheduleRow, utcnow
from geneva_drive.testing import fire_schedules


def _rows() -> dict[str, ScheduleRow]:
    with db.new_session() as session:
        rows = {row.name: row for row in session.scalars(select(ScheduleRow))}
        session.expunge_all()
        return rows


def test_install_adds_the_demo_schedules_once(geneva_session: Any) -> None:
    assert recurring.install() == 4
    assert recurring.install() == 0
    rows = _rows()
    assert set(rows) == set(recurring.DEMO_SCHEDULES)
    assert rows["weekly-export"].paused is True
    assert rows["nightly-report"].timezone == "Europe/Berlin"
    assert rows["queue-probe"].every_seconds == 30


def test_the_probe_and_the_digest_fire_while_you_watch(geneva_session: Any) -> None:
    recurring.install()
    start = utcnow()
    fire_schedules(start + timedelta(seconds=31))
    rows = _rows()
    assert rows["queue-probe"].ticks_created == 1
    fire_schedules(start + timedelta(seconds=61))
    fire_schedules(start + timedelta(seconds=121))
    rows = _rows()
    assert rows["queue-probe"].ticks_created == 3
    # The first digest waits 75 s in its last step: the next minute's tick is skipped.
    assert (rows["digest"].ticks_created, rows["digest"].ticks_skipped) == (1, 1)
    assert "is still ready" in (rows["digest"].last_skip_reason or "")
    assert rows["weekly-export"].ticks_created == 0
