"""engine/persistence.py: the engine's own rows written by Core, the ORM objects kept in sync.

Each test names one part of the contract: only changed columns are written, the object is
clean afterwards (the commit writes nothing more), changes the fast path does not cover still
reach the database through the unit of work, an inserted execution is a persistent,
fully loaded object whose NULL columns are SQL NULL, and a row read by Core becomes the
persistent object an ORM query would have returned (``load``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, inspect, select, text

from geneva_drive import Workflow, db, persistence, step
from geneva_drive.dialects import dialect_for
from geneva_drive.executor import execute
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import StepState
from tests.engine.helpers import executions, make_order, other_session


class PersistFlow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class HookWritesFlow(Workflow):
    """A cancel_if condition that changes a workflow column: the change must be written."""

    cancel_if = "tag_and_continue"

    def tag_and_continue(self) -> bool:
        self.metadata_ = {**(self.metadata_ or {}), "seen_by_condition": True}
        return False

    @step
    def only(self) -> None:
        pass


@contextmanager
def statements() -> Iterator[list[str]]:
    seen: list[str] = []
    engine = db.get_engine()

    def record(_conn, _cursor, statement, _params, _context, _many):  # type: ignore[no-untyped-def]
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _writes(seen: list[str]) -> list[str]:
    return [s for s in seen if s.split(" ", 1)[0] in ("UPDATE", "INSERT", "DELETE")]


def test_flush_updates_only_the_changed_columns_and_leaves_the_object_clean(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    before = workflow.updated_at
    workflow.next_step_name = "second"
    with statements() as seen:
        persistence.flush(geneva_session)
        geneva_session.commit()
    writes = _writes(seen)
    assert len(writes) == 1, writes
    assert writes[0].startswith("UPDATE geneva_drive_workflows SET next_step_name=")
    assert "updated_at=" in writes[0] and "state=" not in writes[0]
    assert not inspect(workflow).modified
    assert workflow.updated_at >= before
    with other_session() as other:
        row = other.execute(
            select(Workflow.next_step_name, Workflow.updated_at).where(Workflow.id == workflow.id)
        ).one()
    assert row.next_step_name == "second"
    assert row.updated_at == workflow.updated_at


def test_flush_with_nothing_changed_writes_nothing(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert workflow.state == "ready"
    with statements() as seen:
        persistence.flush(geneva_session)
        geneva_session.commit()
    assert _writes(seen) == []


def test_changes_the_fast_path_does_not_cover_still_reach_the_database(geneva_session):
    order = make_order(geneva_session)
    workflow = PersistFlow.create(hero=order)
    geneva_session.commit()
    order.status = "paid"  # not an engine row: left to the unit of work
    workflow.next_step_name = "second"
    with statements() as seen:
        persistence.flush(geneva_session)
        geneva_session.commit()
    writes = _writes(seen)
    assert any(w.startswith("UPDATE test_orders SET status=") for w in writes), writes
    assert any(w.startswith("UPDATE geneva_drive_workflows SET next_step_name=") for w in writes)
    geneva_session.expire_all()
    assert order.status == "paid"
    assert workflow.next_step_name == "second"


def test_insert_execution_returns_a_persistent_fully_loaded_clean_object(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    first = workflow.current_execution
    first.state = StepState.CANCELED  # frees the one-active slot; written before the INSERT
    with statements() as seen:
        created = persistence.insert_execution(
            geneva_session,
            workflow_id=workflow.id,
            step_name="second",
            state=StepState.SCHEDULED,
            scheduled_for=first.scheduled_for,
        )
        # Every attribute is loaded: reading them issues no SELECT.
        loaded = (created.outcome, created.cursor, created.metadata_, created.started_at)
    writes = _writes(seen)
    assert writes[0].startswith("UPDATE geneva_drive_step_executions SET state=")
    assert writes[1].startswith("INSERT INTO geneva_drive_step_executions")
    assert [s for s in seen if s.startswith("SELECT")] == []
    assert loaded == (None, None, None, None)
    state = inspect(created)
    assert state.persistent and not state.modified
    assert created in geneva_session
    assert geneva_session.get(StepExecution, created.id) is created
    assert created.created_at is not None and created.updated_at == created.created_at
    geneva_session.commit()
    # None columns were left to their NULL default, not written as JSON null.
    # ``cursor`` is a reserved word on MariaDB/MySQL: quoted as the dialect quotes it.
    cursor = geneva_session.get_bind().dialect.identifier_preparer.quote("cursor")
    raw = geneva_session.execute(
        text(
            f"SELECT {cursor} IS NULL, metadata IS NULL FROM geneva_drive_step_executions "
            "WHERE id = :id"
        ),
        {"id": created.id},
    ).one()
    assert tuple(bool(v) for v in raw) == (True, True)


def test_insert_execution_names_an_unknown_column(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    try:
        persistence.insert_execution(geneva_session, workflow_id=workflow.id, colour="red")
    except TypeError as error:
        assert "colour" in str(error)
    else:  # pragma: no cover - the assertion documents the failure
        raise AssertionError("an unknown column must be refused")


def test_a_step_writes_each_engine_row_once_per_phase(geneva_session):
    """One UPDATE per changed row per phase, one INSERT for the next step: nothing repeated.

    On PostgreSQL the UPDATEs of a phase travel as one statement (data-modifying CTEs), so
    the rows are counted inside the statements, and the statements separately.
    """
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with statements() as seen:
        execute(workflow.current_execution.id)
    writes = [w for w in seen if w.split(" ", 1)[0] in ("UPDATE", "INSERT", "DELETE", "WITH")]
    # The per-state counts keep ready and performing under one row, "ongoing": a
    # step that neither starts nor ends its workflow writes no count (it wrote one upsert per
    # phase, performing then ready, before the two were folded).
    counted = [w for w in writes if "geneva_drive_workflow_counts" in w]
    assert counted == [], writes
    if dialect_for(geneva_session).name == "mysql":  # MariaDB/MySQL
        # One multi-table UPDATE per phase: prepare joins the workflow (performing) and the
        # execution (in_progress); finalize adds the stray sweep's LEFT JOIN; then the INSERT.
        assert len(writes) == 3, writes
        prepare, finalize, insert = writes
        for phase in (prepare, finalize):  # the rows in the session's order, both joined
            assert phase.startswith("UPDATE `geneva_drive_") and " JOIN " in phase, phase
            assert "`geneva_drive_workflows` AS u" in phase, phase
            assert "`geneva_drive_step_executions` AS u" in phase, phase
        assert " s." not in prepare
        assert "LEFT JOIN `geneva_drive_step_executions` AS s" in finalize
        assert "s.id <> " in finalize  # the written execution is not swept
        assert insert.startswith("INSERT INTO geneva_drive_step_executions")
        assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
            ("first", "completed"),
            ("second", "scheduled"),
        ]
        return
    text_of_writes = " ".join(writes)
    # prepare: in_progress; finalize: the stray sweep + completed
    assert text_of_writes.count("UPDATE geneva_drive_step_executions") == 3, writes
    assert text_of_writes.count("INSERT INTO geneva_drive_step_executions") == 1
    # performing, then ready with the next step
    assert text_of_writes.count("UPDATE geneva_drive_workflows") == 2
    if not dialect_for(geneva_session).combined_flush:
        assert len(writes) == 6
    else:
        # PostgreSQL: prepare's two UPDATEs in one statement; finalize's two UPDATEs, the sweep
        # and the next step's INSERT in one more. The INSERT comes after the
        # UPDATEs' CTEs have run (its one-time filter counts them): the one-active index would
        # refuse the new row beside a predecessor still in progress.
        assert len(writes) == 2, writes
        assert writes[0].startswith("WITH") and "set_config" in writes[0]
        finalize = writes[1]
        assert finalize.startswith("WITH") and "geneva_sweep" in finalize
        assert finalize.count("UPDATE geneva_drive_step_executions") == 2
        assert " INSERT INTO geneva_drive_step_executions " in finalize
        assert "SELECT count(*)" in finalize
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "completed"),
        ("second", "scheduled"),
    ]


def test_a_condition_that_changes_the_workflow_has_its_change_written(geneva_session):
    workflow = HookWritesFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    execute(workflow.current_execution.id)
    with other_session() as other:
        metadata = other.scalar(select(Workflow.metadata_).where(Workflow.id == workflow.id))
    assert metadata is not None and metadata.get("seen_by_condition") is True


def test_a_column_set_back_to_its_loaded_value_is_not_written(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    loaded_at = workflow.updated_at
    workflow.next_step_name = workflow.next_step_name
    workflow.state = "ready"
    with statements() as seen:
        persistence.flush(geneva_session)
        geneva_session.commit()
    assert _writes(seen) == []
    assert not inspect(workflow).modified
    assert workflow.updated_at == loaded_at


def _synchronous_commit_per_commit(execution_id: int) -> list[str]:
    """Run the execution; the ``synchronous_commit`` each of its commits ran with, in order."""
    modes: list[str] = []
    engine = db.get_engine()

    def before_commit(conn):  # type: ignore[no-untyped-def]
        modes.append(conn.exec_driver_sql("SELECT current_setting('synchronous_commit')").scalar())

    event.listen(engine, "commit", before_commit)
    try:
        execute(execution_id)
    finally:
        event.remove(engine, "commit", before_commit)
    return modes


def test_postgresql_commits_the_start_transition_asynchronously_and_the_outcome_durably(
    geneva_session,
):
    """The start commit skips its WAL flush; finalize's commit (the outcome) waits for it."""
    if not dialect_for(geneva_session).row_locks:  # SQLite
        pytest.skip("synchronous_commit is PostgreSQL's; SQLite WAL + NORMAL never fsyncs a commit")
    if dialect_for(geneva_session).name == "mysql":  # MariaDB/MySQL
        pytest.skip("MariaDB/MySQL set commit durability server-wide only (innodb_flush_log_*)")
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    modes = _synchronous_commit_per_commit(workflow.current_execution.id)
    assert modes == ["off", "on"]
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "completed"),
        ("second", "scheduled"),
    ]


def test_synchronous_start_commit_makes_the_start_commit_wait_for_its_flush(geneva_session):
    if db.backend(geneva_session) != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    from geneva_drive.config import settings

    settings.synchronous_start_commit = True  # the fixture restores the settings afterwards
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    modes = _synchronous_commit_per_commit(workflow.current_execution.id)
    assert modes == ["on", "on"]


class PausedMidStepFlow(Workflow):
    """Its body pauses the workflow from another connection, as an operator would."""

    @step
    def first(self) -> None:
        with other_session() as other:
            other.execute(
                text("UPDATE geneva_drive_workflows SET state = 'paused' WHERE id = :id"),
                {"id": self.id},
            )
            other.commit()

    @step
    def second(self) -> None:
        pass


class BodyWritesFlow(Workflow):
    """Its body changes a column of its own workflow row through the ORM object."""

    @step
    def first(self) -> None:
        self.metadata_ = {**(self.metadata_ or {}), "written_by_body": True}

    @step
    def second(self) -> None:
        pass


class BodyDetachesFlow(Workflow):
    """Its body expunges everything from the session (finalize must load the rows again)."""

    @step
    def first(self) -> None:
        from sqlalchemy.orm import object_session

        session = object_session(self)
        assert session is not None
        session.expunge_all()

    @step
    def second(self) -> None:
        pass


def test_finalize_sees_what_another_connection_changed_while_the_body_ran(geneva_session):
    workflow = PausedMidStepFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    execute(workflow.current_execution.id)
    # Finalize read the operator's pause: the step is canceled, nothing next is scheduled.
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "canceled"),
    ]
    geneva_session.refresh(workflow)
    assert workflow.state == "paused"


def test_finalize_writes_what_the_body_changed_on_its_workflow(geneva_session):
    workflow = BodyWritesFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    execute(workflow.current_execution.id)
    with other_session() as other:
        metadata = other.scalar(select(Workflow.metadata_).where(Workflow.id == workflow.id))
        state = other.scalar(select(Workflow.state).where(Workflow.id == workflow.id))
    assert metadata is not None and metadata.get("written_by_body") is True
    assert state == "ready"
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "completed"),
        ("second", "scheduled"),
    ]


def test_finalize_loads_the_rows_again_when_the_body_detached_them(geneva_session):
    workflow = BodyDetachesFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    execute(workflow.current_execution.id)
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "completed"),
        ("second", "scheduled"),
    ]


def test_a_rollback_expunges_what_was_inserted_in_its_transaction(geneva_session):
    """As after a flush: the rolled-back rows' objects leave the session (ids can be reused)."""
    geneva_session.commit()
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    first = workflow.current_execution
    first.state = StepState.CANCELED
    execution = persistence.insert_execution(
        geneva_session,
        workflow_id=workflow.id,
        step_name="second",
        state=StepState.SCHEDULED,
        scheduled_for=first.scheduled_for,
    )
    assert workflow in geneva_session and execution in geneva_session
    geneva_session.rollback()
    assert workflow not in geneva_session and execution not in geneva_session
    assert inspect(workflow).transient and inspect(execution).transient
    again = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert again in geneva_session and inspect(again).persistent


def test_a_savepoint_rollback_expires_what_was_written_inside_it(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    before = workflow.next_step_name
    savepoint = geneva_session.begin_nested()
    workflow.next_step_name = "renamed"
    persistence.flush(geneva_session)
    assert not inspect(workflow).modified
    savepoint.rollback()
    # The UPDATE was undone with the savepoint, and the object reads the row again.
    assert "next_step_name" not in inspect(workflow).dict
    assert workflow.next_step_name == before == "first"


def test_several_rows_changed_in_one_flush_are_all_written(geneva_session):
    """PostgreSQL sends them as one statement; every backend writes every row."""
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    execution = workflow.current_execution
    workflow.next_step_name = "second"
    execution.job_id = "job-42"
    with statements() as seen:
        persistence.flush(geneva_session)
        geneva_session.commit()
    writes = [w for w in seen if w.split(" ", 1)[0] in ("UPDATE", "WITH")]
    # PostgreSQL: one statement of CTEs; MariaDB/MySQL: one multi-table UPDATE.
    assert len(writes) == (1 if dialect_for(geneva_session).combined_flush else 2), writes
    assert not inspect(workflow).modified and not inspect(execution).modified
    with other_session() as other:
        assert (
            other.scalar(select(Workflow.next_step_name).where(Workflow.id == workflow.id))
            == "second"
        )
        assert (
            other.scalar(select(StepExecution.job_id).where(StepExecution.id == execution.id))
            == "job-42"
        )


# --- persistence.load(): prepare's objects from its Core lock row ------------------------------


def _row_values(session, cls, pk):  # type: ignore[no-untyped-def]
    table = cls.__table__
    row = session.connection().execute(select(table).where(table.c.id == pk)).one()
    return {column.name: row._mapping[column] for column in table.columns}


def test_load_gives_the_subclass_persistent_clean_and_in_the_identity_map(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as other:
        values = _row_values(other, Workflow, workflow.id)
        loaded = persistence.load(other, Workflow, values)
        assert type(loaded) is PersistFlow
        state = inspect(loaded)
        assert state.persistent and not state.modified
        assert loaded not in other.new and loaded not in other.dirty
        assert (loaded.id, loaded.state, loaded.next_step_name) == (workflow.id, "ready", "first")
        with statements() as seen:
            assert other.get(Workflow, workflow.id) is loaded  # from the identity map
            other.commit()  # nothing to write
        assert [s for s in seen if not s.startswith(("SELECT", "BEGIN"))] == [], seen


def test_load_of_a_type_no_class_claims_is_a_plain_workflow(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as other:
        values = {**_row_values(other, Workflow, workflow.id), "type": "RemovedLongAgoFlow"}
        assert type(persistence.load(other, Workflow, values)) is Workflow


def test_a_loaded_object_lazy_loads_relationships_and_is_expired_by_a_rollback(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as other:
        loaded = persistence.load(other, Workflow, _row_values(other, Workflow, workflow.id))
        assert [e.step_name for e in loaded.step_executions] == ["first"]
        assert loaded.hero is not None and str(loaded.hero.id) == workflow.hero_id
        geneva_session.execute(
            text("UPDATE geneva_drive_workflows SET state = 'paused' WHERE id = :id"),
            {"id": workflow.id},
        )
        geneva_session.commit()
        assert loaded.state == "ready"  # this transaction's snapshot
        other.rollback()
        assert loaded.state == "paused"  # expired by the rollback, read again
        assert loaded in other


def test_load_refreshes_an_object_the_session_already_holds(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as other:
        held = other.get(StepExecution, workflow.current_execution.id)
        assert held is not None and held.state == "scheduled"
        other.commit()
        geneva_session.execute(
            text("UPDATE geneva_drive_step_executions SET state = 'canceled' WHERE id = :id"),
            {"id": held.id},
        )
        geneva_session.commit()
        values = _row_values(other, StepExecution, held.id)
        assert persistence.load(other, StepExecution, values) is held
        assert held.state == "canceled" and not inspect(held).modified


def test_changes_to_a_loaded_object_are_written_by_flush(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as other:
        loaded = persistence.load(other, Workflow, _row_values(other, Workflow, workflow.id))
        loaded.metadata_ = {"note": "written"}
        with statements() as seen:
            persistence.flush(other)
            other.commit()
        assert any(s.startswith(("UPDATE geneva_drive_workflows", "WITH")) for s in seen), seen
    geneva_session.expire_all()
    assert workflow.metadata_ == {"note": "written"}


def test_load_configures_a_class_defined_since_the_last_query(geneva_session):
    """A fresh worker process runs load() before any ORM query: the mappers must be configured
    by load() itself, or the new object has no attribute instrumentation."""
    from geneva_drive.workflow import unregister

    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()

    class PersistLateFlow(Workflow):  # leaves the mapper registry unconfigured, as at start
        @step
        def only(self) -> None:
            pass

    try:
        with other_session() as other:
            values = {**_row_values(other, Workflow, workflow.id), "type": "PersistLateFlow"}
            loaded = persistence.load(other, Workflow, values)
            assert type(loaded) is PersistLateFlow
            assert (loaded.id, loaded.state) == (workflow.id, "ready")
            assert [e.step_name for e in loaded.step_executions] == ["first"]
    finally:
        unregister("PersistLateFlow")


def _park_a_stray(session, workflow) -> StepExecution:
    """A waiting execution beside the workflow's current one (the one-active index leaves
    ``waiting`` alone): what the stray sweep exists to cancel."""
    return persistence.insert_execution(
        session,
        workflow_id=workflow.id,
        step_name="second",
        state=StepState.WAITING,
        scheduled_for=workflow.current_execution.scheduled_for,
    )


def test_the_sweep_travels_with_the_changes_it_precedes(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    current = workflow.current_execution
    stray = _park_a_stray(geneva_session, workflow)
    geneva_session.commit()
    current.state = StepState.IN_PROGRESS  # loaded scheduled: written, and stray itself
    with statements() as seen:
        assert persistence.flush(geneva_session, sweep=(workflow.id, utcnow())) is False
    assert seen == [] and current in geneva_session.dirty  # nothing written: sweep first
    geneva_session.commit()

    current.state = StepState.COMPLETED  # loaded in_progress: not stray
    workflow.next_step_name = "second"
    with statements() as seen:
        swept = persistence.flush(geneva_session, sweep=(workflow.id, utcnow()))
    if not dialect_for(
        geneva_session
    ).combined_flush:  # one statement per row anyway: the caller sweeps
        assert swept is False and seen == []
        return
    assert swept is True
    if dialect_for(geneva_session).name == "mysql":  # MariaDB/MySQL
        assert len(seen) == 1 and "LEFT JOIN `geneva_drive_step_executions` AS s" in seen[0]
    else:
        assert len(seen) == 1 and "geneva_sweep" in seen[0], seen
    geneva_session.commit()
    rows = dict(
        geneva_session.execute(
            text("SELECT id, state FROM geneva_drive_step_executions WHERE workflow_id = :w"),
            {"w": workflow.id},
        ).all()
    )
    assert rows == {current.id: "completed", stray.id: "canceled"}
    canceled_at = geneva_session.scalar(
        text("SELECT canceled_at FROM geneva_drive_step_executions WHERE id = :id"),
        {"id": stray.id},
    )
    assert canceled_at is not None


def test_scheduling_the_next_step_cancels_a_stray_on_every_backend(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    stray = _park_a_stray(geneva_session, workflow)
    geneva_session.commit()
    execute(workflow.current_execution.id)
    states = {e.id: (e.step_name, e.state, e.outcome) for e in executions(geneva_session, workflow)}
    assert states[stray.id] == ("second", "canceled", "canceled")
    assert sorted(v for k, v in states.items() if k != stray.id) == [
        ("first", "completed", "success"),
        ("second", "scheduled", None),
    ]


# --- an INSERT deferred to the next write (a successor inserted already started) -------------


def _drawn_execution_id(session) -> int:
    """An execution id as the executor's lock read draws one (PostgreSQL: from the sequence);
    elsewhere one above every row (the deferral itself works on every backend)."""
    if dialect_for(session).name == "postgresql":
        return int(
            session.scalar(
                text("SELECT nextval(pg_get_serial_sequence('geneva_drive_step_executions', 'id'))")
            )
        )
    return int(
        session.scalar(text("SELECT COALESCE(MAX(id), 0) + 1000 FROM geneva_drive_step_executions"))
    )


def _running(session) -> Workflow:
    """A workflow whose first step is in progress, as finalize finds it."""
    workflow = PersistFlow.create(hero=make_order(session))
    session.commit()
    workflow.current_execution.state = StepState.IN_PROGRESS
    session.commit()
    return workflow


def _defer_second(session, workflow, execution_id: int) -> StepExecution:
    first = workflow.current_execution
    first.state = StepState.COMPLETED  # frees the one-active slot, with the deferred INSERT
    workflow.next_step_name = "second"
    return persistence.insert_execution(
        session,
        sweep=(workflow.id, utcnow()),
        deferred_id=execution_id,
        workflow_id=workflow.id,
        step_name="second",
        state=StepState.SCHEDULED,
        scheduled_for=first.scheduled_for,
    )


def _rows(workflow_id: int) -> dict[int, str]:
    with other_session() as other:
        return dict(
            other.execute(
                text("SELECT id, state FROM geneva_drive_step_executions WHERE workflow_id = :w"),
                {"w": workflow_id},
            ).all()
        )


def test_a_deferred_execution_is_inserted_at_the_commit_as_its_attributes_then_say(geneva_session):
    workflow = _running(geneva_session)
    first = workflow.current_execution
    new_id = _drawn_execution_id(geneva_session)
    with statements() as seen:
        created = _defer_second(geneva_session, workflow, new_id)
        # Nothing is written yet; the object is the session's, under the id drawn for it.
        assert _writes(seen) == [] and [s for s in seen if s.startswith("WITH")] == []
        assert created.id == new_id and geneva_session.get(StepExecution, new_id) is created
        assert inspect(created).persistent
        created.state = StepState.IN_PROGRESS  # what the merged start does before the commit
        created.started_at = utcnow()
        geneva_session.commit()  # no flush first: the commit writes it
    writes = [s for s in seen if s.split(" ", 1)[0] in ("UPDATE", "INSERT", "WITH")]
    assert _rows(workflow.id) == {first.id: "completed", new_id: "in_progress"}
    with other_session() as other:
        assert other.get(StepExecution, new_id).started_at is not None
        assert other.get(type(workflow), workflow.id).next_step_name == "second"
    assert not inspect(created).modified
    if dialect_for(geneva_session).combined_insert:
        # The outcome's UPDATEs, the sweep and the started row: one statement.
        assert len(writes) == 1 and " INSERT INTO geneva_drive_step_executions " in writes[0], (
            writes
        )
        assert "geneva_sweep" in writes[0]


def test_a_rollback_drops_a_deferred_execution_with_its_transaction(geneva_session):
    workflow = _running(geneva_session)
    first = workflow.current_execution
    created = _defer_second(geneva_session, workflow, _drawn_execution_id(geneva_session))
    geneva_session.rollback()
    assert created not in geneva_session and inspect(created).transient
    with statements() as seen:
        geneva_session.commit()
    assert seen == []
    assert _rows(workflow.id) == {first.id: "in_progress"}


def test_the_unit_of_work_writes_a_deferred_execution_before_its_own_rows(geneva_session):
    workflow = _running(geneva_session)
    first = workflow.current_execution
    stray = _park_a_stray(geneva_session, workflow)
    geneva_session.commit()
    new_id = _drawn_execution_id(geneva_session)
    _defer_second(geneva_session, workflow, new_id)
    order = make_order(geneva_session)  # a new object: Session.flush() has work of its own
    geneva_session.flush()
    assert (
        geneva_session.scalar(
            text("SELECT state FROM geneva_drive_step_executions WHERE id = :id"), {"id": new_id}
        )
        == "scheduled"
    )
    geneva_session.commit()
    # The outcome and the sweep went out with it, the unit of work's own row after it.
    assert _rows(workflow.id) == {first.id: "completed", stray.id: "canceled", new_id: "scheduled"}
    assert order.id is not None and not inspect(first).modified


def test_a_second_execution_sweeps_a_deferred_one_as_its_stray(geneva_session):
    """As when two executions are scheduled in one phase: the first goes out, then the
    second's sweep cancels it."""
    workflow = _running(geneva_session)
    first = workflow.current_execution
    deferred = _defer_second(geneva_session, workflow, _drawn_execution_id(geneva_session))
    second = persistence.insert_execution(
        geneva_session,
        sweep=(workflow.id, utcnow()),
        workflow_id=workflow.id,
        step_name="second",
        state=StepState.SCHEDULED,
        scheduled_for=first.scheduled_for,
    )
    geneva_session.commit()
    assert _rows(workflow.id) == {
        first.id: "completed",
        deferred.id: "canceled",
        second.id: "scheduled",
    }


def test_only_an_execution_with_a_sweep_is_deferred(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    with pytest.raises(TypeError, match="deferred_id"):
        persistence.insert_execution(
            geneva_session,
            deferred_id=10**9,
            workflow_id=workflow.id,
            step_name="second",
            state=StepState.SCHEDULED,
            scheduled_for=utcnow(),
        )
