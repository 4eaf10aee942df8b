"""Schedules on /metrics: ``geneva_drive_schedule_ticks_total{schedule, result}`` counted from
each tick a sweep (or Run now) handles, and ``geneva_drive_schedule_late_seconds{schedule}``
from the database - how far the next tick is in the past, 0 when it is not, no series for a
paused or disabled schedule (docs/MANUAL.md, "Recurring work")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import update

from geneva_drive import Schedule, Workflow, metrics, schedules, step
from geneva_drive.models import ScheduleRow, utcnow
from geneva_drive.testing import fire_schedules
from tests.metrics.test_exposition import app, samples, scrape

__all__ = ["app"]


class MetricTickFlow(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        pass


def _figures(app: Any) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """(late seconds by schedule, ticks by (schedule, result))."""
    metrics.clear_cache()
    families = scrape(app.test_client())
    late = {
        dict(k)["schedule"]: v
        for k, v in samples(families["geneva_drive_schedule_late_seconds"]).items()
    }
    ticks = {
        (dict(k)["schedule"], dict(k)["result"]): v
        for k, v in samples(families["geneva_drive_schedule_ticks"]).items()
        if dict(k)["schedule"].startswith("metric-")
    }
    return late, ticks


def _set(geneva_session: Any, name: str, **values: Any) -> None:
    geneva_session.execute(update(ScheduleRow).where(ScheduleRow.name == name).values(**values))
    geneva_session.commit()


def test_late_gauge_and_tick_counter(app: Any, geneva_session: Any) -> None:
    Schedule.create(geneva_session, "metric-pulse", MetricTickFlow, every=60)
    Schedule.create(geneva_session, "metric-paused", MetricTickFlow, every=60)
    Schedule.create(geneva_session, "metric-gone", MetricTickFlow, every=60)
    geneva_session.commit()
    _set(geneva_session, "metric-paused", paused=True, next_fire_at=utcnow() - timedelta(hours=1))
    _set(geneva_session, "metric-gone", disabled_at=utcnow())

    late, ticks = _figures(app)
    assert late == {"metric-pulse": 0.0}  # due in a minute: not late; paused, disabled: no series
    assert ticks == {}

    # Every dispatcher down for 3 min 30 s: the tick is 210 s late...
    at = utcnow() - timedelta(seconds=210)
    _set(geneva_session, "metric-pulse", next_fire_at=at, anchor_at=at)
    late, _ = _figures(app)
    assert 209 <= late["metric-pulse"] <= 240

    # ...until a sweep fires the latest tick and counts the three before it as missed.
    fire_schedules()
    late, ticks = _figures(app)
    assert late["metric-pulse"] == 0.0
    assert ticks == {("metric-pulse", "created"): 1.0, ("metric-pulse", "missed"): 3.0}

    # Run now counts a created tick; a tick while that run goes on (overlap=skip) is skipped.
    with_session_run_now(geneva_session, "metric-pulse")
    _set(geneva_session, "metric-pulse", next_fire_at=utcnow() - timedelta(seconds=1))
    fire_schedules()
    _, ticks = _figures(app)
    assert ticks[("metric-pulse", "created")] == 2.0
    assert ticks[("metric-pulse", "skipped_overlap")] == 1.0


def with_session_run_now(geneva_session: Any, name: str) -> None:
    # The last run is still ready (never executed here): cancel it so Run now is allowed.
    geneva_session.expire_all()
    row = schedules.named(geneva_session, name)
    previous = geneva_session.get(Workflow, row.last_workflow_id)
    previous.cancel()
    geneva_session.commit()
    schedules.run_now(geneva_session, name)
    geneva_session.commit()
