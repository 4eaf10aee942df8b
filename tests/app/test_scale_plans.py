"""The dashboard pages that summarise history read only what they show.

Each test runs a page the way a viewer does (a GET), captures every SELECT it ran, and has the
database explain it: the statements that used to read every failed execution, every signal,
every execution of ongoing workflows, or walk the workflows primary key, now read a range of
an index that holds only recent failures, pending signals or current executions. SQLite's
plans name a walk of a whole table or index ``SCAN``; on PostgreSQL sequential scans are
disabled, so the plan shows whether an index can serve at all (as the filter plans in
tests/reliability/test_security_hardening.py do). MariaDB has no such switch: skipped there.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from geneva_drive.models import ExecutionMinute, Signal, StepExecution, utcnow
from geneva_drive.testing import speedrun_workflow
from tests.app.conftest import DashPayment
from tests.app.plans import full_scans, page_plans
from tests.engine.helpers import make_order

SCANNED = ("geneva_drive_workflows", "geneva_drive_step_executions", "geneva_drive_signals")


_plans = page_plans


def _full_scans(plan: str) -> list[str]:
    return full_scans(plan, SCANNED)


def _statement_reading(plans: list[tuple[str, str]], needle: str) -> tuple[str, str]:
    found = [(s, p) for s, p in plans if needle in s]
    assert found, [s[:120] for s, _ in plans]
    return found[0]


def _failed(geneva_session: Any, count: int = 2) -> list[DashPayment]:
    made = []
    for _ in range(count):
        workflow = DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
        geneva_session.commit()
        DashPayment.fail_charge = True
        with contextlib.suppress(RuntimeError):
            speedrun_workflow(workflow)
        made.append(workflow)
    return made


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_failures_read_recent_failures_through_the_failed_at_index(app, geneva_session, window):
    _failed(geneva_session)
    # One failure long ago: outside every window, and not read.
    geneva_session.execute(
        update(StepExecution)
        .where(
            StepExecution.id == geneva_session.query(StepExecution.id).limit(1).scalar_subquery()
        )
        .values(failed_at=utcnow() - timedelta(days=30))
    )
    geneva_session.commit()
    plans = _plans(app, f"/failures?window={window}")
    _statement, plan = _statement_reading(plans, "max(geneva_drive_step_executions.failed_at)")
    assert "index_geneva_drive_step_executions_failed_at" in plan, plan
    assert not [(s[:200], _full_scans(p)) for s, p in plans if _full_scans(p)]


@pytest.mark.parametrize("url", ["/failures?window=7d", "/"])
def test_after_the_roll_up_the_failures_and_charts_read_minutes_through_their_index(
    app, geneva_session, url
):
    """Once housekeeping has rolled up the settled minutes (engine/rollups.py), the failures
    page and the overview's charts read them through the minute index, and the executions
    only for the minutes since the mark: no walk of any of those tables."""
    from geneva_drive import housekeeping

    _failed(geneva_session)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.failed_at.is_not(None))
        .values(failed_at=utcnow() - timedelta(days=2), finished_at=utcnow() - timedelta(days=2))
    )
    geneva_session.commit()
    housekeeping.run()
    assert geneva_session.scalar(select(func.count()).select_from(ExecutionMinute))
    plans = _plans(app, url)
    _statement, plan = _statement_reading(plans, "FROM geneva_drive_execution_minutes")
    assert "ix_geneva_drive_execution_minutes_minute" in plan, plan
    scanned = (*SCANNED, "geneva_drive_execution_minutes")
    assert not [(s[:200], full_scans(p, scanned)) for s, p in plans if full_scans(p, scanned)]


def test_failures_count_only_failures_in_the_window(geneva_session):
    from geneva_drive.dashboard import queries

    first, second = _failed(geneva_session)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == first.id, StepExecution.state == "failed")
        .values(failed_at=utcnow() - timedelta(days=2))
    )
    geneva_session.commit()
    day = queries.failure_groups(geneva_session, timedelta(hours=24))
    week = queries.failure_groups(geneva_session, timedelta(days=7))
    assert [group.count for group in day] == [1]
    assert [group.count for group in week] == [2]
    assert second.state == "paused"


def test_signal_inbox_reads_pending_signals_through_their_index(app, geneva_session):
    workflow = _failed(geneva_session, 1)[0]
    workflow.signal("confirm")  # stored while paused: pending
    geneva_session.commit()
    plans = _plans(app, "/signals")
    _statement, plan = _statement_reading(plans, "FROM geneva_drive_signals \nWHERE")
    assert "index_geneva_drive_signals_pending" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    assert geneva_session.query(Signal).filter(Signal.state == "pending").count() == 1


def test_definitions_count_current_executions_on_a_gravestone_not_its_history(
    operator_client, geneva_session
):
    """The drain view counts the executions on a removed step that are current now; an
    ongoing workflow that ran it long ago (completed history) does not hold the line."""
    from geneva_drive.dashboard import queries

    current, past = (
        DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
        for _ in range(2)
    )
    geneva_session.commit()
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id.in_([current.id, past.id]))
        .values(step_name="legacy_capture")
    )
    # ``past`` ran legacy_capture to completion and now waits on its next step.
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == past.id)
        .values(state="completed", finished_at=utcnow(), completed_at=utcnow())
    )
    geneva_session.commit()
    assert queries.removed_steps_current(geneva_session, DashPayment) == {"legacy_capture": 1}
    # The gem's engine count keeps its meaning: history of ongoing workflows included.
    assert DashPayment.removed_steps_in_flight(geneva_session) == {"legacy_capture": 2}
    html = operator_client.get("/definitions/DashPayment").get_data(as_text=True)
    row = html.split('class="gravestone">legacy_capture', 1)[1].split("</tr>", 1)[0]
    assert ">1</a>" in row and "safe to delete" not in row
    assert "1 on gravestones" in html


def test_definitions_say_safe_to_delete_only_when_nothing_is_current_or_next_on_it(
    operator_client, geneva_session
):
    from geneva_drive.workflow import Workflow

    workflow = _failed(geneva_session, 1)[0]  # paused, its charge failed
    geneva_session.execute(
        update(Workflow).where(Workflow.id == workflow.id).values(next_step_name="legacy_capture")
    )
    geneva_session.commit()
    html = operator_client.get("/definitions/DashPayment").get_data(as_text=True)
    row = html.split('class="gravestone">legacy_capture', 1)[1].split("</tr>", 1)[0]
    assert "safe to delete" not in row  # a paused workflow will resume onto it
    geneva_session.execute(
        update(Workflow).where(Workflow.id == workflow.id).values(next_step_name="charge")
    )
    geneva_session.commit()
    html = operator_client.get("/definitions/DashPayment").get_data(as_text=True)
    row = html.split('class="gravestone">legacy_capture', 1)[1].split("</tr>", 1)[0]
    assert "safe to delete" in row


def test_definitions_read_current_executions_through_an_index(app, geneva_session):
    _failed(geneva_session, 2)
    plans = _plans(app, "/definitions")
    _statement, plan = _statement_reading(plans, "geneva_drive_step_executions.step_name IN")
    assert "geneva_drive_step_executions" in plan
    assert not _full_scans(plan), plan
    assert not [(s[:200], _full_scans(p)) for s, p in plans if _full_scans(p)]


def test_due_stuck_lists_exactly_the_stuck_workflows(operator_client, geneva_session):
    from geneva_drive import lateness

    stuck, recent, idle = (
        DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
        for _ in range(3)
    )
    geneva_session.commit()
    long_ago = lateness.stuck_in_progress_cutoff(utcnow()) - timedelta(minutes=1)
    for workflow, started in ((stuck, long_ago), (recent, utcnow())):
        geneva_session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .values(state="in_progress", started_at=started)
        )
    geneva_session.commit()
    html = operator_client.get("/workflows?due=stuck").get_data(as_text=True)
    assert f'id="wf-{stuck.id}"' in html
    assert f'id="wf-{recent.id}"' not in html and f'id="wf-{idle.id}"' not in html


def test_due_stuck_reads_stuck_executions_first(app, geneva_session):
    """PostgreSQL: the stuck executions are collected once (an InitPlan through the in-progress
    index) and the workflows fetched by primary key, never a walk of the workflows primary key
    probing each row; SQLite: the IN list is built from an executions index likewise."""
    _failed(geneva_session, 2)
    plans = _plans(app, "/workflows?due=stuck")
    _statement, plan = _statement_reading(plans, "FROM geneva_drive_workflows")
    assert not _full_scans(plan), plan
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite"):
        # The IN list comes from an index range of in-progress executions; then rowid lookups.
        assert "LIST SUBQUERY" in plan, plan
        assert "SEARCH geneva_drive_step_executions USING" in plan, plan
        assert "USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
    else:
        # The workflows are looked up by the collected ids, never filtered row by row.
        assert "index_geneva_drive_step_executions_in_progress_started_at" in plan, plan
        assert "InitPlan" in plan, plan
        assert "Index Cond: (id = ANY" in plan, plan
        assert "Filter: (ANY" not in plan and "SubPlan" not in plan, plan


def _hinted_index() -> list[tuple[str, str]]:
    from geneva_drive.dashboard.charts import DURATIONS_INDEX
    from geneva_drive.dashboard.queries import CURRENT_EXECUTIONS_INDEX

    return [
        ("ORDER BY geneva_drive_step_executions.finished_at", DURATIONS_INDEX),
        ("GROUP BY geneva_drive_step_executions.step_name", CURRENT_EXECUTIONS_INDEX),
    ]


@pytest.mark.parametrize(
    ("needle", "index"),
    _hinted_index(),
    ids=["durations through the finished_at index", "drain count through the current index"],
)
def test_the_definition_page_names_its_index_where_mariadb_picks_a_worse_one(
    app, geneva_session, needle, index
):
    """MariaDB's optimizer took the in-progress index for the step durations of
    ``/definitions/<class>`` and sorted every completed execution (9.8 s at 1M workflows), and
    counted the removed steps' current executions workflows first, probing the executions of
    every ongoing workflow of the class (35 ms at 1M; 8.5 ms executions first). Each statement
    names its index there, and the plan reads the executions through it."""
    from sqlalchemy import event

    from geneva_drive.dashboard.extensions import db
    from tests.app.conftest import login

    workflow = DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
    geneva_session.commit()
    DashPayment.fail_charge = False
    # authorize and charge complete; the workflow then parks at confirm (a RuntimeError here).
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(workflow)
    with app.app_context():
        engine = db.engine
    if engine.dialect.name not in ("mysql", "mariadb"):
        pytest.skip("the index hints are MariaDB's; the other planners pick the index themselves")
    statements: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        client = login(app.test_client(), "olga")
        page = client.get(f"/definitions/{DashPayment.__name__}", headers={"HX-Request": "true"})
        assert page.status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    found = [(s, p) for s, p in statements if needle in s]
    assert found, [s[:120] for s, _ in statements]
    statement, parameters = found[0]
    assert f"FORCE INDEX ({index})" in statement
    with engine.connect() as connection:
        plan = connection.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
    executions = [row for row in plan if row["table"] == "geneva_drive_step_executions"]
    assert [row["key"] for row in executions] == [index], plan
