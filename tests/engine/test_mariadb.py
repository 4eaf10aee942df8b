"""engine/db.py on MariaDB/MySQL: the session settings every engine connection gets.

READ COMMITTED is not a preference: under InnoDB's default REPEATABLE READ the signal/gate race
of test_signals_race.py loses a wake-up (the gate's snapshot misses a signal committed after
its transaction began, and the step parks for good), measured while choosing it.
"""

from __future__ import annotations

import sys

import pytest
from sqlalchemy import text

from geneva_drive import db
from geneva_drive.errors import ConfigurationError
from tests.backends import url_backend

on_mysql = pytest.mark.skipif(
    url_backend() != "mysql", reason="needs GENEVA_TEST_DATABASE_URL=mysql+pymysql://…"
)


@on_mysql
def test_engine_connections_run_read_committed_in_utc(geneva_session):
    connection = geneva_session.connection()
    assert connection.get_isolation_level() == "READ COMMITTED"
    assert geneva_session.scalar(text("SELECT @@session.time_zone")) == "+00:00"
    assert geneva_session.scalar(text("SELECT @@character_set_connection")) == "utf8mb4"


@on_mysql
def test_the_dashboards_engine_runs_read_committed_too(geneva_database, geneva_session):
    """`geneva-drive up` runs its worker on Flask-SQLAlchemy's engine: same settings."""
    from geneva_drive.dashboard import create_app
    from geneva_drive.dashboard.extensions import db as flask_db

    app = create_app({"TESTING": True, "SQLALCHEMY_DATABASE_URI": geneva_database.url})
    try:
        with app.app_context(), flask_db.engine.connect() as connection:
            assert connection.get_isolation_level() == "READ COMMITTED"
            assert connection.scalar(text("SELECT @@session.time_zone")) == "+00:00"
    finally:
        with app.app_context():
            flask_db.engine.dispose()
        db.configure(engine=geneva_database.engine)


@on_mysql
def test_a_url_of_its_own_may_choose_another_isolation_level(geneva_database):
    engine = db.make_engine(geneva_database.url, isolation_level="REPEATABLE READ")
    try:
        with engine.connect() as connection:
            assert connection.get_isolation_level() == "REPEATABLE READ"
    finally:
        engine.dispose()


def test_a_missing_mysql_driver_is_named_with_the_url_form_to_use(monkeypatch):
    """A misconfiguration, typed as one: the setting (the URL) is what to change."""
    monkeypatch.setitem(sys.modules, "MySQLdb", None)  # mysqlclient not installed
    with pytest.raises(ConfigurationError) as raised:
        db.make_engine("mysql+mysqldb://app:secret@db.internal:3306/app")
    message = str(raised.value)
    assert "mysql+mysqldb://app:***@db.internal:3306/app" in message
    assert "secret" not in message
    assert "GENEVA_DATABASE_URL=mysql+pymysql://" in message


def _insert_workflow(session, type_: str, hero_type: str | None, hero_id: str | None) -> None:  # type: ignore[no-untyped-def]
    session.execute(
        text(
            "INSERT INTO geneva_drive_workflows (type, hero_type, hero_id, state, "
            "allow_multiple, created_at, updated_at) VALUES (:t, :ht, :hid, 'ready', 0, "
            "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        ),
        {"t": type_, "ht": hero_type, "hid": hero_id},
    )


@on_mysql
def test_the_ongoing_key_tells_apart_heroes_whose_parts_run_together(geneva_session):
    """The generated key joins type, hero type and hero id: length prefixes keep ("a", "b:c")
    and ("a:b", "c") apart, where a plain separator would make them one key."""
    from sqlalchemy.exc import IntegrityError

    _insert_workflow(geneva_session, "Flow", "a", "b:c")
    _insert_workflow(geneva_session, "Flow", "a:b", "c")
    _insert_workflow(geneva_session, "Flow", None, "c")  # no hero type: never collides
    _insert_workflow(geneva_session, "Flow", None, "c")
    geneva_session.commit()
    with pytest.raises(IntegrityError):
        _insert_workflow(geneva_session, "Flow", "a", "b:c")
    geneva_session.rollback()
    # Once finished, a workflow no longer holds its key.
    geneva_session.execute(
        text("UPDATE geneva_drive_workflows SET state = 'finished' WHERE hero_type = 'a'")
    )
    _insert_workflow(geneva_session, "Flow", "a", "b:c")
    geneva_session.commit()
