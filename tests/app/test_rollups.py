"""The per-minute rollup of finished executions (engine/rollups.py) that the charts
and the failures page read. Whatever housekeeping has rolled up, the counts equal the ones
computed here from the executions themselves: before the first pass, after it, after a second
pass at the same moment (nothing counted twice), after later passes that move the window, and
with two passes racing. The failures page an operator opens shows the same groups before and
after the roll-up.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import delete, select, update

from geneva_drive import housekeeping, rollups, step
from geneva_drive.models import ExecutionHour, ExecutionMinute, RollupMark, StepExecution
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.engine.helpers import make_order


class RolledUp(Workflow):
    """fetch (fails once, reattempted) → send → settle (fails: ValueError or KeyError)."""

    attempts: ClassVar[dict[int, int]] = {}

    @step(on_exception="reattempt", max_reattempts=2)
    def fetch(self) -> None:
        seen = RolledUp.attempts.get(self.id, 0)
        RolledUp.attempts[self.id] = seen + 1
        if seen == 0:
            raise TimeoutError("slow upstream")

    @step
    def send(self) -> None:
        pass

    @step(on_exception="pause")
    def settle(self) -> None:
        if self.id % 2:
            raise ValueError("bad amount")
        raise KeyError("no account")


#: How long before "now" the seeded executions finished: both sides of the settle margin, of
#: minute and hour edges, of the 24 h and 7 d windows, and older than the rollup keeps.
AGES = (
    timedelta(seconds=10),
    timedelta(minutes=2, seconds=5),
    timedelta(minutes=4, seconds=59),
    timedelta(minutes=5, seconds=1),
    timedelta(minutes=6),
    timedelta(minutes=17, microseconds=500_000),
    timedelta(minutes=59, seconds=30),
    timedelta(minutes=60, seconds=30),
    timedelta(minutes=61),
    timedelta(hours=3, seconds=17),
    timedelta(hours=5),
    timedelta(hours=23, minutes=59, seconds=50),
    timedelta(hours=24, seconds=10),
    timedelta(hours=25),
    timedelta(days=3),
    timedelta(days=6, hours=23, minutes=59),
    timedelta(days=7, minutes=1),
    timedelta(days=9),
)


def _seed(
    session: Any, now: datetime, workflows: int = 8, ages: tuple[timedelta, ...] = AGES
) -> None:
    """``workflows`` RolledUp workflows run until settle fails (four executions each), their
    executions moved to have finished at ``ages`` before ``now`` (cycled)."""
    made = []
    for _ in range(workflows):
        workflow = RolledUp.create(hero=make_order(session), session=session)
        session.commit()
        for _attempt in range(5):  # speedrun_workflow re-raises each exception a step raises
            try:
                speedrun_workflow(workflow)
            except (TimeoutError, ValueError, KeyError):
                pass
            if workflow.state == "paused":
                break
        assert workflow.state == "paused", workflow
        made.append(workflow.id)
    ids = session.scalars(
        select(StepExecution.id)
        .where(StepExecution.workflow_id.in_(made), StepExecution.finished_at.is_not(None))
        .order_by(StepExecution.id)
    ).all()
    for index, execution_id in enumerate(ids):
        at = now - ages[index % len(ages)]
        values: dict[str, Any] = {"finished_at": at, "started_at": at}
        state = session.scalar(select(StepExecution.state).where(StepExecution.id == execution_id))
        values[f"{state}_at"] = at
        session.execute(
            update(StepExecution).where(StepExecution.id == execution_id).values(values)
        )
    session.commit()


def _executions(session: Any) -> list[Any]:
    session.expire_all()
    return session.execute(
        select(
            Workflow.type,
            StepExecution.step_name,
            StepExecution.state,
            StepExecution.outcome,
            StepExecution.error_class_name,
            StepExecution.finished_at,
            StepExecution.failed_at,
            StepExecution.id,
        ).join(Workflow, Workflow.id == StepExecution.workflow_id)
    ).all()


def _kind(state: str, outcome: str | None) -> str | None:
    if state == "failed":
        return "failed"
    if outcome == "reattempted":
        return "reattempted"
    return "completed" if state == "completed" else None


def _exact_chart(
    session: Any, since: datetime, seconds: int, until: datetime | None = None
) -> dict[tuple[str, int, str], int]:
    """The chart counts computed in Python from every execution row (the oracle)."""
    found: Counter[tuple[str, int, str]] = Counter()
    for cls, _step, state, outcome, _error, finished, _failed, _id in _executions(session):
        kind = _kind(state, outcome)
        if finished is None or kind is None or finished < since:
            continue
        if until is not None and finished >= until:
            continue
        found[(cls, math.floor(finished.timestamp() / seconds), kind)] += 1
    return dict(found)


def _exact_failures(session: Any, since: datetime) -> dict[tuple[str, str, str | None], Any]:
    groups: dict[tuple[str, str, str | None], list[Any]] = {}
    for cls, step_name, state, _outcome, error, _finished, failed, execution_id in _executions(
        session
    ):
        if state != "failed" or failed is None or failed < since:
            continue
        group = groups.setdefault((cls, step_name, error), [0, failed, execution_id])
        group[0] += 1
        group[1] = max(group[1], failed)
        group[2] = max(group[2], execution_id)
    return {key: tuple(value) for key, value in groups.items()}


def _failures(session: Any, since: datetime) -> dict[tuple[str, str, str | None], Any]:
    return {
        (g.workflow_class, g.step_name, g.error_class): (
            g.count,
            g.last_failed_at,
            g.last_execution_id,
        )
        for g in rollups.failure_counts(session, since)
    }


def _windows(now: datetime) -> list[tuple[datetime, int, datetime | None]]:
    hour = datetime.fromtimestamp(math.floor(now.timestamp() / 3600) * 3600, tz=UTC)
    return [
        (now - timedelta(hours=1), 60, None),  # the minute chart
        (now - timedelta(hours=24), 3600, None),  # the hour chart
        (now - timedelta(hours=24, seconds=17), 3600, None),  # a ragged first minute
        (hour - timedelta(hours=23), 3600, hour),  # the settled hours, as charts reads them
        (now - timedelta(days=8), 60, now - timedelta(minutes=30, seconds=20)),
        (now - timedelta(days=30), 3600, None),  # older than the rollup keeps
    ]


def _assert_exact(session: Any, now: datetime) -> None:
    for since, seconds, until in _windows(now):
        expected = _exact_chart(session, since, seconds, until)
        assert rollups.chart_counts(session, since, seconds, until) == expected, (since, until)
    for window in (timedelta(hours=1), timedelta(hours=24), timedelta(days=7), timedelta(days=30)):
        assert _failures(session, now - window) == _exact_failures(session, now - window), window


def _rolled(session: Any) -> dict[tuple[int, str, str, str, str], int]:
    session.expire_all()
    return {
        (r.minute, r.type, r.step_name, r.kind, r.error_class_name): r.count
        for r in session.scalars(select(ExecutionMinute))
    }


def _hours(session: Any) -> dict[tuple[int, str, str, str, str], int]:
    session.expire_all()
    return {
        (r.minute, r.type, r.step_name, r.kind, r.error_class_name): r.count
        for r in session.scalars(select(ExecutionHour))
    }


def _hours_from_minutes(session: Any) -> dict[tuple[int, str, str, str, str], int]:
    """What the hours should hold: the rolled-up minutes of each hour the hours' mark covers,
    summed."""
    mark = session.get(RollupMark, rollups.HOURS_MARK)
    session.refresh(mark)
    summed: Counter[tuple[int, str, str, str, str]] = Counter()
    for (minute, *key), n in _rolled(session).items():
        if mark.from_minute <= minute < mark.until_minute:
            summed[(minute // 60 * 60, *key)] += n  # type: ignore[arg-type]
    return dict(summed)


def test_counts_equal_the_executions_before_and_after_each_roll_up(
    geneva_session: Any, frozen_clock: Any
) -> None:
    now = frozen_clock.now
    _seed(geneva_session, now)
    _assert_exact(geneva_session, now)  # nothing rolled up yet: all read from executions

    housekeeping.run(now)  # the phase runs guarded: a failure shows as nothing rolled
    rolled = _rolled(geneva_session)
    assert rolled, "housekeeping rolled nothing up"
    mark = geneva_session.get(RollupMark, rollups.MARK)
    assert mark.from_minute == rollups.minute_of(now - rollups.RETAIN)
    assert mark.until_minute == rollups.minute_of(now - rollups.SETTLE_AFTER)
    # Only settled minutes, none older than the rollup keeps.
    assert all(mark.from_minute <= minute < mark.until_minute for minute, *_ in rolled)
    unsettled = sum(1 for age in AGES if age <= rollups.SETTLE_AFTER)
    assert unsettled and sum(rolled.values()) < len(_executions(geneva_session))
    _assert_exact(geneva_session, now)

    # A second pass at the same moment counts nothing again.
    assert rollups.roll_up(now) == 0
    assert _rolled(geneva_session) == rolled
    _assert_exact(geneva_session, now)

    # Later: more executions, finished since (an execution's finished_at is when it finished,
    # never in a minute already rolled up), and a pass that rolls up the minutes settled since.
    later = now + timedelta(minutes=42, seconds=7)
    frozen_clock.now = later
    _seed(
        geneva_session, later, workflows=3, ages=tuple(a for a in AGES if a < timedelta(minutes=40))
    )
    _assert_exact(geneva_session, later)
    assert rollups.roll_up(later) > 0
    _assert_exact(geneva_session, later)


def test_the_rolled_range_keeps_eight_days_and_restarts_after_a_long_stop(
    geneva_session: Any, frozen_clock: Any
) -> None:
    now = frozen_clock.now
    _seed(geneva_session, now)
    rollups.roll_up(now)
    nine_days_old = rollups.minute_of(now - timedelta(days=9))
    assert not [m for m, *_ in _rolled(geneva_session) if m <= nine_days_old]

    # Two days on, the minutes older than eight days are dropped from the table ...
    later = now + timedelta(days=2)
    frozen_clock.now = later
    rollups.roll_up(later)
    mark = geneva_session.get(RollupMark, rollups.MARK)
    geneva_session.refresh(mark)
    assert mark.from_minute == rollups.minute_of(later - rollups.RETAIN)
    assert min(m for m, *_ in _rolled(geneva_session)) >= mark.from_minute
    _assert_exact(geneva_session, later)  # ... and read from the executions, which are kept

    # Housekeeping stopped for ten days: the mark fell behind what is kept, so the rolled
    # range restarts eight days back instead of claiming the minutes it never counted.
    stopped = later + timedelta(days=10)
    frozen_clock.now = stopped
    rollups.roll_up(stopped)
    geneva_session.refresh(mark)
    assert mark.from_minute == rollups.minute_of(stopped - rollups.RETAIN)
    assert mark.until_minute == rollups.minute_of(stopped - rollups.SETTLE_AFTER)
    # The hours restart with the minutes: whole hours inside what the minutes hold, and none
    # older.
    hours_mark = geneva_session.get(RollupMark, rollups.HOURS_MARK)
    geneva_session.refresh(hours_mark)
    assert hours_mark.from_minute == -(-mark.from_minute // 60) * 60
    assert hours_mark.until_minute == mark.until_minute // 60 * 60
    assert all(m >= hours_mark.from_minute for m, *_ in _hours(geneva_session))
    assert _hours(geneva_session) == _hours_from_minutes(geneva_session)
    _assert_exact(geneva_session, stopped)


def test_executions_deleted_after_the_roll_up_stay_counted(
    geneva_session: Any, frozen_clock: Any
) -> None:
    now = frozen_clock.now
    _seed(geneva_session, now)
    rollups.roll_up(now)
    # From a whole hour, as the hour chart reads (a window's ragged first minute is read from
    # the executions).
    since = datetime.fromtimestamp(math.floor(now.timestamp() / 3600 - 23) * 3600, tz=UTC)
    before = rollups.chart_counts(geneva_session, since, 3600)
    old = now - timedelta(hours=2)
    geneva_session.execute(delete(StepExecution).where(StepExecution.finished_at < old))
    geneva_session.commit()
    assert rollups.chart_counts(geneva_session, since, 3600) == before
    assert _exact_chart(geneva_session, since, 3600) != before  # the rows really went


def test_two_passes_at_once_count_each_minute_once(geneva_session: Any, frozen_clock: Any) -> None:
    now = frozen_clock.now
    _seed(geneva_session, now)
    barrier = threading.Barrier(2)
    counted: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            counted.append(rollups.roll_up(now))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    settled = now - rollups.SETTLE_AFTER
    expected = sum(
        1
        for _cls, _step, state, outcome, _e, finished, _f, _id in _executions(geneva_session)
        if finished is not None
        and _kind(state, outcome) is not None
        and now - rollups.RETAIN <= finished
        and finished < datetime.fromtimestamp(rollups.minute_of(settled) * 60, tz=UTC)
    )
    # The passes take turns chunk by chunk (each under the mark's lock): between them, every
    # execution once.
    assert len(counted) == 2 and sum(counted) == expected
    assert sum(_rolled(geneva_session).values()) == expected
    # One mark each for the minutes and the hours, and each hour summed once.
    assert set(geneva_session.scalars(select(RollupMark.name))) == {
        rollups.MARK,
        rollups.HOURS_MARK,
    }
    assert _hours(geneva_session) == _hours_from_minutes(geneva_session)
    _assert_exact(geneva_session, now)


def test_whole_hours_are_summed_from_their_minutes_and_the_week_reads_them(
    geneva_session: Any, frozen_clock: Any
) -> None:
    from sqlalchemy import event

    now = frozen_clock.now
    _seed(geneva_session, now)
    rollups.roll_up(now)
    minutes_mark = geneva_session.get(RollupMark, rollups.MARK)
    hours_mark = geneva_session.get(RollupMark, rollups.HOURS_MARK)
    assert hours_mark.from_minute == -(-minutes_mark.from_minute // 60) * 60
    assert hours_mark.until_minute == minutes_mark.until_minute // 60 * 60
    hours = _hours(geneva_session)
    assert hours and hours == _hours_from_minutes(geneva_session)
    assert all(minute % 60 == 0 for minute, *_ in hours)

    rollups.roll_up(now)  # again at the same moment: nothing summed twice
    assert _hours(geneva_session) == hours

    week_reads: list[str] = []
    chart_reads: list[str] = []
    reads = week_reads

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        reads.append(statement)

    engine = geneva_session.get_bind()
    event.listen(engine, "before_cursor_execute", capture)
    try:
        week = _failures(geneva_session, now - timedelta(days=7))
        reads = chart_reads
        minute_chart = rollups.chart_counts(geneva_session, now - timedelta(hours=1), 60)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert week == _exact_failures(geneva_session, now - timedelta(days=7))
    assert minute_chart == _exact_chart(geneva_session, now - timedelta(hours=1), 60, None)
    assert any("FROM geneva_drive_execution_hours" in s for s in week_reads), week_reads
    # Minute buckets cannot come from hours.
    assert not any("geneva_drive_execution_hours" in s for s in chart_reads), chart_reads

    # An hour later the next hour is summed too, and every window stays exact.
    later = now + timedelta(hours=1, minutes=3)
    frozen_clock.now = later
    rollups.roll_up(later)
    assert len(_hours(geneva_session)) >= len(hours)
    assert _hours(geneva_session) == _hours_from_minutes(geneva_session)
    _assert_exact(geneva_session, later)


_GROUP = re.compile(r"<tr[^>]*>(.*?)</tr>", re.S)


def _failure_rows(client: Any, window: str) -> list[str]:
    page = client.get(f"/failures?window={window}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    table = html[html.index('id="failures"') :]
    rows = [re.sub(r"\s+", " ", row).strip() for row in _GROUP.findall(table)]
    return [row for row in rows if "<td" in row]


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_the_failures_page_shows_the_same_groups_after_the_roll_up(
    operator_client: Any, geneva_session: Any, frozen_clock: Any, window: str
) -> None:
    now = frozen_clock.now
    _seed(geneva_session, now)
    before = _failure_rows(operator_client, window)
    assert before and all("RolledUp" in row for row in before)
    housekeeping.run(now)
    assert _rolled(geneva_session)
    assert _failure_rows(operator_client, window) == before
