"""The ``geneva_session`` pytest fixture (registered through the ``pytest11`` entry point).

Each test gets an empty database holding every table of ``geneva_drive.models.Base.metadata`` (so a
test may map its own hero models on ``Base``): a new SQLite file in WAL mode by default, or a
fresh PostgreSQL schema when ``GENEVA_TEST_DATABASE_URL`` points at PostgreSQL, or a fresh
database (``gd_<random>``, dropped afterwards) when it points at MariaDB/MySQL
(``mysql+pymysql://root@127.0.0.1:3306/test``: the URL's own database is only connected to). The engine's
own session factory, executor, dispatcher and housekeeping are pointed at it, and messages
that would go to Celery are recorded (``geneva_transport``) instead of sent.

A host application's own tables come along when its conftest overrides ``geneva_metadata``::

    @pytest.fixture
    def geneva_metadata():
        return [db.metadata]          # the host's Flask-SQLAlchemy metadata

    @pytest.fixture
    def app(geneva_database):
        return create_app({"TESTING": True, **geneva_database.flask_config()})

``flask_config()`` points a Flask-SQLAlchemy app at the test database (on PostgreSQL, at the
test's schema), so a test can drive the host's webhook route and the workflow it wakes.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, text
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.db import is_mysql_url
from geneva_drive.models import Base, mysql_collation


@dataclass
class TestDatabase:
    engine: Engine
    url: str
    schema: str | None
    #: The per-test database on MariaDB/MySQL (dropped by dispose()); None elsewhere. ``url``
    #: then names it, ``admin_url`` the database it was created from.
    database: str | None = None
    admin_url: str | None = None

    def flask_config(self) -> dict[str, Any]:
        """``SQLALCHEMY_DATABASE_URI`` (and engine options) for a Flask-SQLAlchemy app that
        should use this database."""
        config: dict[str, Any] = {"SQLALCHEMY_DATABASE_URI": self.url}
        if self.schema is not None:
            config["SQLALCHEMY_ENGINE_OPTIONS"] = {
                "connect_args": {"options": f"-csearch_path={self.schema}"}
            }
        return config

    def dispose(self) -> None:
        self.engine.dispose()
        if self.schema is not None:
            admin = db.make_engine(self.url)
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            admin.dispose()
        if self.database is not None:
            _drop_later(self.admin_url or self.url, self.database)


def create_mysql_database(url: str, prefix: str = "gd") -> tuple[str, str]:
    """A new empty MariaDB/MySQL database next to ``url``'s: (its name, its URL)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        # The engine's tables name their collation themselves; the tests' hero tables take
        # the database's, the same binary NO PAD one (models.mysql_collation).
        collation = mysql_collation(connection.dialect)
        connection.execute(
            text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {collation}")
        )
    admin.dispose()
    return name, make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_mysql_database(url: str, name: str) -> None:
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    admin.dispose()


# MariaDB/MySQL: create_all runs one DDL statement per index (about 30, each an InnoDB table
# change with its own log flushes: 1.3 s per test measured). Instead the tables are created
# once per session by create_all in a template database, and each test's database replays the
# server's own ``SHOW CREATE TABLE`` of them: one statement per table, the same tables (columns,
# generated columns, indexes, foreign keys, charset) that create_all made. Keyed by the set of
# tables, so a test module that maps another table gets a template of its own.
_templates: dict[tuple[str, ...], tuple[str, list[str]]] = {}
_template_url: list[str] = []


def _mysql_schema(url: str) -> list[str]:
    key = tuple(table.name for table in Base.metadata.sorted_tables)
    found = _templates.get(key)
    if found is None:
        name, template_url = create_mysql_database(url, prefix="gd_tmpl")
        engine = db.make_engine(template_url, poolclass=NullPool)
        try:
            Base.metadata.create_all(engine)
            with engine.connect() as connection:
                ddl = [
                    str(connection.execute(text(f"SHOW CREATE TABLE `{table}`")).one()[1])
                    for table in key
                ]
        finally:
            engine.dispose()
        found = _templates[key] = (name, ddl)
        _template_url[:] = [url]
    return found[1]


def create_mysql_test_database(url: str) -> tuple[str, str]:
    """A new MariaDB/MySQL database holding the engine's (and the tests') tables."""
    ddl = _mysql_schema(url)
    name = f"gd_{uuid.uuid4().hex[:12]}"
    admin = db.make_engine(url, poolclass=NullPool)
    try:
        with admin.begin() as connection:
            collation = mysql_collation(connection.dialect)
            connection.exec_driver_sql(
                f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {collation}"
            )
            connection.exec_driver_sql(f"USE `{name}`")
            connection.exec_driver_sql("SET foreign_key_checks = 0")  # tables in any order
            for statement in ddl:
                connection.exec_driver_sql(statement)
    finally:
        admin.dispose()
    return name, make_url(url).set(database=name).render_as_string(hide_password=False)


# Dropping a test's database (0.1-0.2 s of server DDL) overlaps the next test: one thread
# drops them in order; the session's end waits for it.
_drops: queue.Queue[tuple[str, str] | None] = queue.Queue()
_dropper: list[threading.Thread] = []


def _drop_in_background() -> None:
    while (item := _drops.get()) is not None:
        try:
            drop_mysql_database(*item)
        except Exception as error:  # reported, not raised: the test itself already ended
            print(f"geneva_drive.testing: could not drop test database {item[1]}: {error}")


def _drop_later(url: str, name: str) -> None:
    if not _dropper:
        thread = threading.Thread(target=_drop_in_background, name="gd-drop", daemon=True)
        thread.start()
        _dropper.append(thread)
    _drops.put((url, name))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop the MariaDB/MySQL test databases still queued and this session's templates."""
    if _dropper:
        _drops.put(None)
        _dropper.pop().join(timeout=120)
    for name, _ddl in _templates.values():
        drop_mysql_database(_template_url[0], name)
    _templates.clear()


def create_test_database(directory: Path, metadata: Sequence[MetaData] = ()) -> TestDatabase:
    """An empty database with the engine's tables (and ``metadata``'s), per
    GENEVA_TEST_DATABASE_URL."""
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if url and make_url(url).get_backend_name() == "postgresql":
        schema = f"gd_{uuid.uuid4().hex[:12]}"
        admin = db.make_engine(url)
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        admin.dispose()
        engine = db.make_engine(
            url, connect_args={"options": f"-csearch_path={schema}"}, pool_size=10, max_overflow=20
        )
        _create_all(engine, metadata)
        return TestDatabase(engine, url, schema)
    if url and is_mysql_url(url):
        name, database_url = create_mysql_test_database(url)
        engine = db.make_engine(database_url, pool_size=10, max_overflow=20)
        return TestDatabase(engine, database_url, None, database=name, admin_url=url)
    path = directory / "geneva.sqlite3"
    sqlite_url = f"sqlite:///{path}"
    engine = db.make_engine(sqlite_url)
    _create_all(engine, metadata)
    return TestDatabase(engine, sqlite_url, None)


def _create_all(engine: Engine, metadata: Sequence[MetaData]) -> None:
    Base.metadata.create_all(engine)
    for extra in metadata:
        if extra is not Base.metadata:
            extra.create_all(engine)


@pytest.fixture
def geneva_metadata() -> list[MetaData]:
    """Extra metadata whose tables each test database gets: override it in a host's conftest
    to return the host's ``MetaData`` (one, or a list)."""
    return []


@pytest.fixture
def geneva_database(
    tmp_path: Path, geneva_metadata: MetaData | Sequence[MetaData]
) -> Iterator[TestDatabase]:
    extra = [geneva_metadata] if isinstance(geneva_metadata, MetaData) else list(geneva_metadata)
    database = create_test_database(tmp_path, extra)
    previous = db._engine
    db.configure(engine=database.engine)
    try:
        yield database
    finally:
        if previous is not None:
            db.configure(engine=previous)
        database.dispose()


@pytest.fixture
def geneva_transport() -> Iterator[transport.RecordingTransport]:
    recording = transport.RecordingTransport()
    previous = transport._transport
    transport.set_transport(recording)
    try:
        yield recording
    finally:
        transport.set_transport(previous)


@pytest.fixture
def geneva_session(
    geneva_database: TestDatabase, geneva_transport: transport.RecordingTransport
) -> Iterator[Session]:
    snapshot: dict[str, Any] = {k: v for k, v in vars(settings).items() if not k.startswith("_")}
    session = db.SessionFactory()
    db.set_current_session(session)
    try:
        yield session
    finally:
        db.set_current_session(None)
        session.rollback()
        session.close()
        for key, value in snapshot.items():
            setattr(settings, key, value)
