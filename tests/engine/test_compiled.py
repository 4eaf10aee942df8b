"""engine/compiled.py: the hot statements run on the driver's cursor, as SQLAlchemy would run them.

Each test pins one promise of the module: the same rows (values type-processed exactly as
SQLAlchemy's own execution returns them), the same effects (bound values processed, the
statement's own values bound), statement listeners still see every statement, a driver error
is still SQLAlchemy's exception (and a dead PostgreSQL connection is invalidated in the pool),
and statements it cannot run faithfully are refused when compiled.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import bindparam, create_engine, event, exc, func, select, text, update
from sqlalchemy.pool import NullPool

from geneva_drive import db
from geneva_drive.compiled import Compiled
from geneva_drive.executor import _LOCK_READ
from geneva_drive.models import StepExecution, utcnow
from tests.backends import connection_id, terminate
from tests.engine.helpers import make_order
from tests.engine.test_persistence import PersistFlow

_EXECUTIONS = StepExecution.__table__


def _committed_execution(session) -> StepExecution:
    """The first execution of a new two-step workflow, committed."""
    execution = PersistFlow.create(hero=make_order(session)).current_execution
    session.commit()
    return execution


def _scheduled_row(workflow_id: int, now: datetime) -> dict[str, object]:
    """The columns of a new scheduled execution of step ``second``."""
    return {
        "workflow_id": workflow_id,
        "step_name": "second",
        "state": "scheduled",
        "scheduled_for": now,
        "created_at": now,
        "updated_at": now,
    }


def test_a_row_read_is_what_sqlalchemy_returns_for_the_same_statement(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    execution = workflow.current_execution
    # Every kind of column the lock read carries: JSON, timestamps, NULLs, text, integers.
    execution.metadata_ = {"note": "ü", "nested": {"n": [1, 2.5, None, True]}}
    execution.cursor = ["a", 3]
    execution.started_at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    geneva_session.commit()
    connection = geneva_session.connection()
    if connection.dialect.name == "postgresql":
        # The driver returns timestamps in the session's zone; the column type makes them UTC.
        connection.execute(text("SET LOCAL timezone = 'Asia/Kathmandu'"))

    expected = tuple(connection.execute(_LOCK_READ, {"execution_id": execution.id}).one())
    row = Compiled(_LOCK_READ).first(connection, {"execution_id": execution.id})

    assert row == expected
    assert [type(value) for value in row] == [type(value) for value in expected]
    started = row[len(workflow.__table__.columns) + list(_EXECUTIONS.c.keys()).index("started_at")]
    assert started == datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert started.tzinfo is not None and started.utcoffset() == timedelta(0)


def test_no_row_is_none(geneva_session):
    assert Compiled(_LOCK_READ).first(geneva_session.connection(), {"execution_id": -1}) is None


def test_bound_values_are_processed_and_the_statements_own_values_bound(geneva_session):
    execution = _committed_execution(geneva_session)
    statement = Compiled(
        update(_EXECUTIONS)
        .where(_EXECUTIONS.c.id == bindparam("pk"))
        .values(
            outcome="skipped",  # bound by the statement itself
            metadata=bindparam("meta", type_=_EXECUTIONS.c.metadata.type),
            waiting_since=bindparam("since", type_=_EXECUTIONS.c.waiting_since.type),
            updated_at=bindparam("since", type_=_EXECUTIONS.c.updated_at.type),
        )
    )
    # A naive datetime is UTC to the column type; a dict becomes JSON.
    naive = datetime(2026, 3, 4, 5, 6, 7)
    changed = statement.execute(
        geneva_session.connection(), {"pk": execution.id, "meta": {"k": [1]}, "since": naive}
    )
    assert changed == 1
    geneva_session.commit()
    geneva_session.expire_all()
    fresh = geneva_session.get(StepExecution, execution.id)
    assert fresh.outcome == "skipped"
    assert fresh.metadata_ == {"k": [1]}
    assert fresh.waiting_since == naive.replace(tzinfo=UTC)


def test_a_missing_value_is_refused_naming_it(geneva_session):
    statement = Compiled(
        update(_EXECUTIONS)
        .where(_EXECUTIONS.c.id == bindparam("pk"))
        .values(outcome="x", updated_at=bindparam("now", type_=_EXECUTIONS.c.updated_at.type))
    )
    with pytest.raises(TypeError, match="needs a value for now, pk"):
        statement.execute(geneva_session.connection(), {})


def test_insert_gives_the_new_rows_id(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    workflow.current_execution.state = "completed"
    geneva_session.flush()
    connection = geneva_session.connection()
    now = utcnow()
    values = _scheduled_row(workflow.id, now)
    # With RETURNING id, and without it (SQLite: the driver's lastrowid).
    for returning in (True, False):
        built = _EXECUTIONS.insert().values({k: bindparam(k) for k in values})
        if returning:
            if not connection.dialect.insert_returning:
                continue
            built = built.returning(_EXECUTIONS.c.id)
        new_id = Compiled(built).lastrowid(connection, values)
        newest = connection.execute(select(func.max(_EXECUTIONS.c.id))).scalar_one()
        assert new_id == newest
        connection.execute(
            update(_EXECUTIONS)
            .where(_EXECUTIONS.c.id == new_id)
            .values(state="completed", updated_at=now)
        )


def test_statement_listeners_see_every_compiled_statement(geneva_session):
    seen: list[str] = []

    def record(_conn, _cursor, statement, _params, _context, _many):  # type: ignore[no-untyped-def]
        seen.append(statement)

    engine = db.get_engine()
    event.listen(engine, "before_cursor_execute", record)
    try:
        Compiled(_LOCK_READ).first(geneva_session.connection(), {"execution_id": 1})
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(seen) == 1 and seen[0].lstrip().startswith("SELECT")


def test_a_driver_error_is_sqlalchemys_exception_and_the_session_recovers(geneva_session):
    workflow = PersistFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    # A second scheduled execution of the workflow violates the one-active unique index.
    now = utcnow()
    values = _scheduled_row(workflow.id, now)
    statement = Compiled(_EXECUTIONS.insert().values({k: bindparam(k) for k in values}))
    with pytest.raises(exc.IntegrityError):
        statement.lastrowid(geneva_session.connection(), values)
    geneva_session.rollback()
    assert geneva_session.scalar(text("SELECT 1")) == 1


def test_a_terminated_server_connection_is_invalidated_and_replaced(geneva_session):
    connection = geneva_session.connection()
    if connection.dialect.name == "sqlite":
        pytest.skip("ending a connection from the server side needs PostgreSQL or MariaDB")
    # The session keeps its connection checked out (in a transaction) while another one,
    # outside the pool, terminates its backend.
    backend = connection_id(connection)
    killer_engine = create_engine(db.get_engine().url, poolclass=NullPool)
    try:
        with killer_engine.begin() as killer:
            terminate(killer, backend)
    finally:
        killer_engine.dispose()
    with pytest.raises(exc.OperationalError) as raised:
        Compiled(_LOCK_READ).first(geneva_session.connection(), {"execution_id": 1})
    assert raised.value.connection_invalidated
    geneva_session.rollback()
    # The pool replaced the dead connection: the next statement runs on a new backend.
    assert connection_id(geneva_session) != backend


def test_statements_it_cannot_run_faithfully_are_refused(geneva_session):
    expanding = select(_EXECUTIONS.c.id).where(
        _EXECUTIONS.c.id.in_(bindparam("ids", expanding=True))
    )
    with pytest.raises(ValueError, match="plain statements only"):
        Compiled(expanding).first(geneva_session.connection(), {"ids": [1]})


def test_on_a_bare_connection_it_begins_a_transaction_as_execute_would(geneva_session):
    execution = _committed_execution(geneva_session)
    statement = Compiled(
        update(_EXECUTIONS)
        .where(_EXECUTIONS.c.id == bindparam("pk"))
        .values(outcome="x", updated_at=bindparam("now", type_=_EXECUTIONS.c.updated_at.type))
    )
    with db.get_engine().connect() as connection:
        assert not connection.in_transaction()
        statement.execute(connection, {"pk": execution.id, "now": utcnow()})
        assert connection.in_transaction()
        connection.rollback()  # SQLAlchemy knows the transaction: the write is undone
        outcome = connection.execute(
            select(_EXECUTIONS.c.outcome).where(_EXECUTIONS.c.id == execution.id)
        ).scalar_one()
    assert outcome is None
