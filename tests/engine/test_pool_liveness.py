"""engine/db.py: a pooled PostgreSQL or MariaDB connection is tested at checkout only after sitting idle.

A connection back in the pool for less than ``GENEVA_POOL_PING_AFTER`` seconds is handed out
as is (no round trip); one idle for longer is pinged first, and a dead one is replaced before
the caller sees it - a server restart or an idle-connection timeout costs no failed step. One
that died within the window is met by the executor's first statement of a phase, which then
starts the phase again on a new connection (engine/executor.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.orm import object_session
from sqlalchemy.pool import NullPool

from geneva_drive import Workflow, db, step
from geneva_drive.executor import execute
from geneva_drive.models import StepExecution
from tests.backends import connection_id, on_server_database, terminate

URL = os.environ.get("GENEVA_TEST_DATABASE_URL") or ""
pytestmark = pytest.mark.skipif(
    not on_server_database(),
    reason="pool liveness is for server databases; needs GENEVA_TEST_DATABASE_URL on "
    "PostgreSQL or MariaDB",
)


@pytest.fixture
def counting_engine(monkeypatch) -> Iterator[Callable[..., tuple[Engine, list[int]]]]:
    """``counting_engine(ping_after, **engine_options)``: an engine from ``db.make_engine``
    with a one-connection pool, and the list its dialect's pings append to."""
    engines: list[Engine] = []

    def build(ping_after: str, **options: Any) -> tuple[Engine, list[int]]:
        monkeypatch.setenv("GENEVA_POOL_PING_AFTER", ping_after)
        engine = db.make_engine(URL, pool_size=1, max_overflow=0, **options)
        engines.append(engine)
        pings: list[int] = []
        original = engine.dialect.do_ping

        def counting_ping(dbapi_connection):  # type: ignore[no-untyped-def]
            pings.append(1)
            return original(dbapi_connection)

        monkeypatch.setattr(engine.dialect, "do_ping", counting_ping)
        return engine, pings

    yield build
    for engine in engines:
        engine.dispose()


@pytest.fixture
def counted(counting_engine) -> tuple[Engine, list[int]]:  # type: ignore[no-untyped-def]
    return counting_engine("0.2")


def _wait_until_gone(pid: int, timeout: float = 30.0) -> None:
    """Until the server no longer lists connection ``pid`` (it ends a killed one on its own
    time, which on a loaded machine can be later than a fixed sleep)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"
        if URL.startswith("postgresql")
        else "SELECT count(*) FROM information_schema.processlist WHERE id = :pid"
    )
    watcher = create_engine(URL, poolclass=NullPool)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with watcher.connect() as connection:
                if not connection.execute(text(query), {"pid": pid}).scalar():
                    return
            time.sleep(0.05)
        raise AssertionError(f"connection {pid} still listed {timeout} s after it was ended")
    finally:
        watcher.dispose()


def _backend(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection_id(connection)


def _terminate(pid: int) -> None:
    killer = create_engine(URL, poolclass=NullPool)
    try:
        with killer.begin() as connection:
            terminate(connection, pid)
    finally:
        killer.dispose()


def test_a_connection_back_in_the_pool_moments_ago_is_not_pinged(counting_engine):
    # A window of a minute: with 0.2 s, a loaded machine can pause this loop longer than the
    # window between two checkouts, and the ping is then right.
    engine, pings = counting_engine("60")
    first = _backend(engine)  # a new connection: just opened, not pinged either
    for _ in range(5):
        assert _backend(engine) == first
    assert pings == []


def test_a_connection_idle_longer_than_the_window_is_pinged(counted):
    engine, pings = counted
    first = _backend(engine)
    time.sleep(0.3)
    assert _backend(engine) == first
    assert pings == [1]


def test_a_dead_idle_connection_is_replaced_before_the_caller_sees_it(counted):
    engine, pings = counted
    first = _backend(engine)
    _terminate(first)
    _wait_until_gone(first)  # the server ends it asynchronously; a live one answers the ping
    time.sleep(0.3)
    second = _backend(engine)  # no error: the ping found it dead, the pool opened another
    assert second != first
    assert pings == [1]


def test_pool_ping_after_zero_pings_every_checkout(counting_engine):
    engine, pings = counting_engine("0")
    for _ in range(3):
        _backend(engine)
    assert len(pings) == 3


def test_an_explicit_pool_pre_ping_keeps_sqlalchemys_own_check(counting_engine):
    # A window of a minute would let every checkout below through untested; SQLAlchemy's
    # pre-ping tests each reuse of the pooled connection (not the first, freshly opened one).
    engine, pings = counting_engine("60", pool_pre_ping=True)
    for _ in range(4):
        _backend(engine)
    assert len(pings) == 3


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_setting_names_itself_and_the_way_out(monkeypatch, value):
    monkeypatch.setenv("GENEVA_POOL_PING_AFTER", value)
    with pytest.raises(ValueError, match=r"GENEVA_POOL_PING_AFTER=.* seconds >= 0"):
        db.make_engine(URL)


# --- the executor: a connection that died moments after its last use ----------------------------


class LosesItsConnection(Workflow):
    """The body kills the backend of the connection its session holds: finalize's first
    statement then meets a dead connection that no checkout test would have caught."""

    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        session = object_session(self)
        assert session is not None
        _terminate(connection_id(session))


class QuietFlow(Workflow):
    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        pass


def _first_execution_id(workflow_id: int) -> int:
    with db.transaction() as session:
        return int(
            session.scalars(
                select(StepExecution.id).where(StepExecution.workflow_id == workflow_id)
            ).one()
        )


def _state(workflow_id: int) -> tuple[str, list[tuple[str, str]]]:
    with db.transaction() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        rows = session.execute(
            select(StepExecution.state, StepExecution.outcome).where(
                StepExecution.workflow_id == workflow_id
            )
        ).all()
        return workflow.state, [tuple(row) for row in rows]


@pytest.fixture
def pg_database(geneva_database, geneva_transport):  # type: ignore[no-untyped-def]
    """The test database, configured as the engine's (a server database: the module's skip)."""
    assert geneva_database.schema is not None or geneva_database.database is not None
    return geneva_database


def test_finalize_starts_again_on_a_new_connection_when_its_connection_died(pg_database):
    with db.transaction() as session:
        workflow_id = LosesItsConnection.create(session=session).id
    assert execute(_first_execution_id(workflow_id)) is True
    assert _state(workflow_id) == ("finished", [("completed", "success")])


def test_prepare_starts_again_on_a_new_connection_when_the_pooled_ones_died(pg_database):
    with db.transaction() as session:
        workflow_id = QuietFlow.create(session=session).id
    execution_id = _first_execution_id(workflow_id)
    # Every connection idle in the pool was in use moments ago (no checkout test) and is dead.
    engine = pg_database.engine
    held = [engine.connect() for _ in range(engine.pool.checkedin())]
    pids = [connection_id(c) for c in held]
    for connection in held:
        connection.close()
    for pid in pids:
        _terminate(pid)
    assert execute(execution_id) is True
    assert _state(workflow_id) == ("finished", [("completed", "success")])


# --- psycopg's "connection socket closed" ------------------------------------------------------


class SocketClosesUnderFinalize(Workflow):
    """The body arms a failure of finalize's first statement: psycopg's "connection socket
    closed", which it raises when poll() reports the server's hang-up before libpq has read it
    (a backend terminated moments before the statement; CI met it once in
    test_finalize_starts_again_on_a_new_connection_when_its_connection_died). libpq has not
    marked the connection broken yet, so SQLAlchemy's own check does not see a disconnect."""

    may_proceed_without_hero = True
    armed: list[bool] = []

    @step
    def only(self) -> None:
        SocketClosesUnderFinalize.armed.append(True)


def test_a_socket_closed_under_finalize_starts_the_phase_again_on_a_new_connection(
    pg_database, monkeypatch
):
    if not URL.startswith("postgresql"):
        pytest.skip("psycopg's message; PyMySQL's lost connections carry their own codes")
    import psycopg
    from sqlalchemy import event

    engine = db.get_engine()
    failed: list[int] = []

    def socket_closed(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if SocketClosesUnderFinalize.armed and not failed and "FOR UPDATE" in statement:
            failed.append(1)
            raise psycopg.OperationalError("connection socket closed")

    SocketClosesUnderFinalize.armed = []
    event.listen(engine, "before_cursor_execute", socket_closed)
    try:
        with db.transaction() as session:
            workflow_id = SocketClosesUnderFinalize.create(session=session).id
        assert execute(_first_execution_id(workflow_id)) is True
    finally:
        event.remove(engine, "before_cursor_execute", socket_closed)
    assert failed == [1]  # finalize's lock read met it once, then ran on a new connection
    assert _state(workflow_id) == ("finished", [("completed", "success")])
