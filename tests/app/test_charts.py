"""The trend charts (app/charts.py): counts equal to the executions they stand for, and a
settled bucket read once per app, so a render costs the last few minutes, not a day of activity."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import event, update

from geneva_drive.dashboard import charts
from geneva_drive.models import StepExecution
from tests.app.conftest import run_to_finish


def _finish_at(session: Any, workflow_id: int, at: Any) -> None:
    """Move a finished workflow's executions to have finished at ``at``."""
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow_id)
        .values(finished_at=at, started_at=at)
    )
    session.commit()


def _day_total(trend_list: list[Any]) -> dict[str, int]:
    day = next(t for t in trend_list if "day" in t.name)
    return day.overall.total


def test_settled_hours_are_read_once_and_the_last_minutes_every_time(
    app: Any, geneva_session: Any, make_workflow: Any, frozen_clock: Any
) -> None:
    now = frozen_clock.now
    old, recent = make_workflow(), make_workflow()
    run_to_finish(old)
    run_to_finish(recent)
    _finish_at(geneva_session, old.id, now - timedelta(hours=3))
    _finish_at(geneva_session, recent.id, now - timedelta(seconds=30))
    per_workflow = len(old.step_executions)

    from geneva_drive.dashboard.extensions import db

    with app.app_context():
        engine = db.engine
        statements: list[tuple[str, Any]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            if "floor" in statement:  # the charts' bucketed counts
                statements.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", capture)
        try:
            first = charts.trends(db.session, now)
            first_reads = len(statements)
            statements.clear()
            # A settled hour is not read again: an execution moved into it (which a real
            # one never is: finished_at is when it finished) does not show.
            late = make_workflow()
            run_to_finish(late)
            _finish_at(geneva_session, late.id, now - timedelta(hours=3))
            # An execution finishing now is in a live bucket: it shows at once.
            fresh = make_workflow()
            run_to_finish(fresh)
            _finish_at(geneva_session, fresh.id, now - timedelta(seconds=10))
            second = charts.trends(db.session, now)
        finally:
            event.remove(engine, "before_cursor_execute", capture)

    assert _day_total(first)["completed"] == 2 * per_workflow
    assert _day_total(second)["completed"] == 3 * per_workflow  # fresh, not late
    # The first render read the settled buckets and the live ones of each window; the second
    # only the live ones.
    assert first_reads == 4
    assert len(statements) == 2


def test_a_new_app_reads_the_whole_window_again(
    app_factory: Any, geneva_session: Any, make_workflow: Any, frozen_clock: Any
) -> None:
    now = frozen_clock.now
    workflow = make_workflow()
    run_to_finish(workflow)
    _finish_at(geneva_session, workflow.id, now - timedelta(hours=5))
    from geneva_drive.dashboard.extensions import db

    for _ in range(2):  # each app keeps its own settled buckets
        app = app_factory()
        with app.app_context():
            assert _day_total(charts.trends(db.session, now))["completed"] == len(
                workflow.step_executions
            )
    later = make_workflow()
    run_to_finish(later)
    _finish_at(geneva_session, later.id, now - timedelta(hours=5))
    app = app_factory()
    with app.app_context():
        assert _day_total(charts.trends(db.session, now))["completed"] == len(
            workflow.step_executions
        ) + len(later.step_executions)


def test_a_burst_over_a_few_minutes_is_clipped_not_the_scale():
    """Seeding writes thousands of executions over two or three minutes of the hour chart:
    those bars are clipped together, and the scale stays where the other minutes are."""
    minutes = [40, 35, 42, 38, 4000, 3800, 2500] + [39] * 20
    assert charts.robust_scale(minutes) == 63
    assert charts.robust_scale([4000, 40, 38]) == 60  # one spike, as before
    assert charts.robust_scale([50, 45, 40]) == 50  # no spike: the tallest bar


def test_the_time_axis_ends_at_now_not_at_the_end_of_the_current_bucket():
    from datetime import UTC, datetime

    now = datetime(2026, 3, 2, 15, 20, tzinfo=UTC)
    last = int(now.timestamp()) // 3600
    chart = charts._chart("All classes", {}, last - 23, 24, 3600, now)
    assert chart.ticks[-1].label == "now"
    assert chart.ticks[0].label == "16:00"  # the first bucket: 16:00 yesterday
