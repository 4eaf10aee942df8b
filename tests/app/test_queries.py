"""Unit tests of the dashboard's queries (app/queries.py) on the test database.

The pages' tests (test_pages.py) show that the numbers appear; these pin what each query
selects, and that "overdue" and "stuck" mean what housekeeping acts on (engine/lateness.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from geneva_drive import Workflow, step
from geneva_drive.dashboard import queries
from geneva_drive.dashboard.queries import WorkflowFilters
from geneva_drive.models import utcnow
from tests.engine.helpers import create_workflow


class QueryFlow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


def _ids(session, filters: WorkflowFilters) -> set[int]:  # type: ignore[no-untyped-def]
    stmt = queries.filtered_workflows(filters).with_only_columns(Workflow.id)
    return set(session.scalars(stmt))


# --- filters ---------------------------------------------------------------------------------


def test_filters_from_args_clean_values_and_drop_an_unknown_due():
    filters = WorkflowFilters.from_args(
        {"class": " QueryFlow ", "state": "paused\x00", "due": "sometime", "q": "#42"}
    )
    assert (filters.cls, filters.state, filters.due, filters.q) == (
        "QueryFlow",
        "paused",
        "",
        "#42",
    )
    assert filters.as_params() == {"class": "QueryFlow", "state": "paused", "q": "#42"}
    assert filters.without("state").as_params() == {"class": "QueryFlow", "q": "#42"}
    assert WorkflowFilters().is_empty and not filters.is_empty
    assert "due=stuck" in WorkflowFilters(due="stuck").query_string(after=None, page=2)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("42", 42), ("#42", 42), (" 7 ", 7), ("", None), ("x", None), ("²", None), ("9" * 30, None)],
)
def test_parse_id_accepts_ascii_ids_within_range(value, expected):
    assert queries.parse_id(value) == expected


def test_filter_by_class_state_and_search(geneva_session):
    ready = create_workflow(geneva_session, QueryFlow)
    paused = create_workflow(geneva_session, QueryFlow)
    paused.pause()
    geneva_session.commit()
    assert _ids(geneva_session, WorkflowFilters(cls="QueryFlow")) >= {ready.id, paused.id}
    assert _ids(geneva_session, WorkflowFilters(state="paused")) == {paused.id}
    assert _ids(geneva_session, WorkflowFilters(q=f"#{ready.id}")) == {ready.id}
    hero = f"{ready.hero_type}:{ready.hero_id}"
    assert _ids(geneva_session, WorkflowFilters(q=hero)) == {ready.id}


def test_due_overdue_means_past_due_of_a_runnable_workflow(geneva_session):
    past = utcnow() - timedelta(minutes=5)
    late = create_workflow(geneva_session, QueryFlow, scheduled_for=past)
    on_time = create_workflow(
        geneva_session, QueryFlow, scheduled_for=utcnow() + timedelta(hours=1)
    )
    paused = create_workflow(geneva_session, QueryFlow, scheduled_for=past)
    paused.pause()  # its preserved execution waits for resume() on purpose
    geneva_session.commit()
    found = _ids(geneva_session, WorkflowFilters(due="overdue"))
    assert late.id in found
    assert on_time.id not in found and paused.id not in found


def test_due_stuck_means_in_progress_past_the_threshold(geneva_session):
    long_ago = utcnow() - timedelta(hours=2)
    stuck = create_workflow(geneva_session, QueryFlow, state="in_progress", started_at=long_ago)
    geneva_session.execute(
        update(Workflow)
        .where(Workflow.id == stuck.id)
        .values(state="performing", current_step_name="first")
    )
    busy = create_workflow(geneva_session, QueryFlow, state="in_progress", started_at=utcnow())
    geneva_session.commit()
    found = _ids(geneva_session, WorkflowFilters(due="stuck"))
    assert stuck.id in found and busy.id not in found


def test_keyset_page_is_newest_first_with_cursors_both_ways(geneva_session):
    made = sorted((create_workflow(geneva_session, QueryFlow).id for _ in range(3)), reverse=True)
    stmt = queries.filtered_workflows(WorkflowFilters(cls="QueryFlow"))
    first = queries.keyset_page(geneva_session, stmt, Workflow.id, limit=2)
    assert [w.id for w in first.items] == made[:2]
    assert (first.newer, first.older) == (None, made[1])
    second = queries.keyset_page(geneva_session, stmt, Workflow.id, after=first.older, limit=2)
    assert [w.id for w in second.items] == made[2:]
    assert (second.newer, second.older) == (made[2], None)
    back = queries.keyset_page(geneva_session, stmt, Workflow.id, before=second.newer, limit=2)
    assert [w.id for w in back.items] == made[:2]


def test_the_overdue_list_is_sorted_by_lateness_and_pages_through_it(geneva_session):
    now = utcnow()
    minutes = [3, 50, 12, 50, 7]  # two equally late: the lower id first
    made = [
        create_workflow(geneva_session, QueryFlow, scheduled_for=now - timedelta(minutes=m)).id
        for m in minutes
    ]
    geneva_session.commit()
    expected = [made[1], made[3], made[2], made[4], made[0]]  # most late first
    filters = WorkflowFilters(cls="QueryFlow", due="overdue")
    first = queries.overdue_page(geneva_session, filters, None, None, limit=2)
    assert [w.id for w in first.items] == expected[:2]
    assert (first.newer, first.older) == (None, expected[1])
    second = queries.overdue_page(geneva_session, filters, first.older, None, limit=2)
    assert [w.id for w in second.items] == expected[2:4]
    third = queries.overdue_page(geneva_session, filters, second.older, None, limit=2)
    assert [w.id for w in third.items] == expected[4:]
    assert third.older is None
    back = queries.overdue_page(geneva_session, filters, None, third.newer, limit=2)
    assert [w.id for w in back.items] == expected[2:4]


# --- the overview ------------------------------------------------------------------------------


def test_overview_stuck_scheduled_counts_what_housekeeping_recovers(app, geneva_session):
    stale = utcnow() - timedelta(hours=1)
    # Due and sent an hour ago: the message was lost (a message sent recently waits in the
    # broker's queue and is not stuck).
    create_workflow(
        geneva_session, QueryFlow, scheduled_for=stale, sent_at=stale
    )  # ready: housekeeping recovers it
    paused = create_workflow(geneva_session, QueryFlow, scheduled_for=stale, sent_at=stale)
    paused.pause()  # paused: housekeeping leaves it for resume()
    geneva_session.commit()
    create_workflow(
        geneva_session, QueryFlow, scheduled_for=utcnow() - timedelta(minutes=1)
    )  # overdue, not stuck
    with app.app_context():
        numbers = queries.overview(geneva_session)
    assert numbers.stuck_scheduled == 1
    assert numbers.overdue == 2
    assert numbers.counts["QueryFlow"]["paused"] == 1


def test_the_overdue_card_counts_its_list_and_the_stuck_up_to_the_cap(
    app, geneva_session, monkeypatch
):
    """The overdue card counts its list's rows, and the stuck ones among them, up to the cap
    ("10,000+"), and says how late the oldest is, whatever the cap."""
    now = utcnow()
    for minutes in (2, 30, 10, 20, 5):  # stuck past 15 minutes: the 20 and the 30
        due = now - timedelta(minutes=minutes)
        create_workflow(geneva_session, QueryFlow, scheduled_for=due, sent_at=due)
    create_workflow(geneva_session, QueryFlow, scheduled_for=now + timedelta(hours=1))
    geneva_session.commit()
    listed = queries.overdue_page(
        geneva_session, WorkflowFilters(due="overdue"), None, None, limit=50
    )
    assert len(listed.items) == 5

    def card() -> tuple[int, int, float]:
        with app.app_context():
            numbers = queries.overview(geneva_session)
        return numbers.overdue, numbers.stuck_scheduled, numbers.oldest_overdue_seconds

    overdue, stuck, oldest = card()
    assert (overdue, stuck) == (5, 2)
    assert oldest == pytest.approx(30 * 60, abs=60)
    monkeypatch.setattr(queries, "COUNT_CAP", 2)  # "2+": counted up to three rows
    overdue, stuck, oldest = card()
    assert (overdue, stuck) == (3, 2)
    assert oldest == pytest.approx(30 * 60, abs=60)
    monkeypatch.setattr(queries, "COUNT_CAP", 0)  # counted up to one row
    assert card()[:2] == (1, 1)


def test_executions_of_lists_a_workflows_history_in_order(geneva_session):
    workflow = create_workflow(geneva_session, QueryFlow)
    from geneva_drive.testing import speedrun_workflow

    speedrun_workflow(workflow)
    history = queries.executions_of(geneva_session, workflow.id)
    assert [e.step_name for e in history] == ["first", "second"]
    assert all(e.finished_at is not None for e in history)
    assert geneva_session.scalar(select(Workflow.state).where(Workflow.id == workflow.id)) == (
        "finished"
    )


# --- the overview's snapshot beside the page -------------------------------------------------


def _statements_by_thread(engine):  # type: ignore[no-untyped-def]
    """``(record, stop)``: ``record`` fills with ``(thread name, statement)`` for each statement
    ``engine`` runs until ``stop()``."""
    import threading

    from sqlalchemy import event

    record: list[tuple[str, str]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        record.append((threading.current_thread().name, statement))

    event.listen(engine, "before_cursor_execute", capture)
    return record, lambda: event.remove(engine, "before_cursor_execute", capture)


def test_the_overview_reads_its_snapshot_on_a_connection_of_its_own_and_shows_its_numbers(
    app, geneva_session
):
    """The metrics snapshot (class counts, unexplained) runs in a thread of its own beside the
    page's other statements, and the page shows the numbers it found."""
    from geneva_drive import metrics
    from geneva_drive.dashboard.extensions import db
    from tests.app.conftest import login

    for _ in range(3):
        create_workflow(geneva_session, QueryFlow)
    paused = create_workflow(geneva_session, QueryFlow)
    paused.pause()
    geneva_session.commit()
    metrics.clear_cache()
    with app.app_context():
        engine = db.engine
    record, stop = _statements_by_thread(engine)
    try:
        html = login(app.test_client(), "olga").get("/").get_data(as_text=True)
    finally:
        stop()
    beside = {name for name, _ in record if name.startswith("geneva-drive-beside")}
    assert beside, sorted({name for name, _ in record})
    snapshot_tables = " ".join(s for name, s in record if name in beside)
    page_tables = " ".join(s for name, s in record if name not in beside)
    assert "geneva_drive_workflow_counts" in snapshot_tables  # the class counts
    assert "geneva_drive_workflow_counts" not in page_tables  # read once, there
    assert page_tables  # the page's own statements ran in the request's thread
    card = html.split('id="stat-paused"', 1)[1].split("</a>", 1)[0]
    assert '<span class="n">1</span> paused' in card
    row = html.split('class=QueryFlow">QueryFlow</a></th>', 1)[1].split("</tr>", 1)[0]
    for state, count in (("ready", 3), ("paused", 1), ("finished", 0)):
        cell = row.split(f'data-label="{state}"', 1)[1].split("</td>", 1)[0]
        assert f">{count}</a>" in cell, (state, cell)


def test_the_overview_reads_its_snapshot_in_the_request_where_the_pool_has_one_connection(
    app_factory, geneva_database, geneva_session
):
    """A pool of one connection for every thread (``StaticPool``: an in-memory SQLite, a
    session bound to a test transaction) cannot serve two statements at once: the snapshot
    then runs in the request's thread, and the page still shows it."""
    from sqlalchemy.pool import StaticPool

    from geneva_drive import metrics
    from geneva_drive.dashboard.extensions import db
    from tests.app.conftest import app_config, login

    create_workflow(geneva_session, QueryFlow)
    geneva_session.commit()
    metrics.clear_cache()
    options = dict(app_config(geneva_database).get("SQLALCHEMY_ENGINE_OPTIONS", {}))
    options["poolclass"] = StaticPool
    app = app_factory(SQLALCHEMY_ENGINE_OPTIONS=options)
    with app.app_context():
        engine = db.engine
    record, stop = _statements_by_thread(engine)
    try:
        page = login(app.test_client(), "olga").get("/")
    finally:
        stop()
    assert page.status_code == 200
    threads = {name for name, _ in record}
    assert not any(name.startswith("geneva-drive-beside") for name in threads), threads
    assert any("geneva_drive_workflow_counts" in s for _, s in record)
