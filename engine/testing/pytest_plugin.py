"""The ``geneva_session`` pytest fixture (registered through the ``pytest11`` entry point).

Each test gets an empty database holding every table of ``geneva_drive.models.Base.metadata`` (so a
test may map its own hero models on ``Base``): a new SQLite file in WAL mode by default, or a
fresh PostgreSQL schema when ``GENEVA_TEST_DATABASE_URL`` points at PostgreSQL, or a fresh
database (``gd_<random>``, dropped afterwards) when it points at MariaDB/MySQL
(``mysql+pymysql://root@127.0.0.1:3306/test``: the URL's own database is only connected to). The engine's
own session factory, executor, dispatcher and housekeeping are pointed at it, and messages
that would go to Celery are recorded (``geneva_transport``) instead of sent.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.models import Base


@dataclass
class TestDatabase:
    engine: Engine
    url: str
    schema: str | None
    #: The per-test database on MariaDB/MySQL (dropped by dispose()); None elsewhere.
    database: str | None = None

    def dispose(self) -> None:
        self.engine.dispose()
        if self.schema is not None:
            admin = db.make_engine(self.url)
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            admin.dispose()
        if self.database is not None:
            drop_mysql_database(self.url, self.database)


def is_mysql_url(url: str | None) -> bool:
    return bool(url) and make_url(url or "").get_backend_name() in db.MYSQL_DIALECTS


def create_mysql_database(url: str, prefix: str = "gd") -> tuple[str, str]:
    """A new empty MariaDB/MySQL database next to ``url``'s: (its name, its URL)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        connection.execute(
            text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        )
    admin.dispose()
    return name, make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_mysql_database(url: str, name: str) -> None:
    admin = db.make_engine(url, poolclass=NullPool)
    with admin.begin() as connection:
        connection.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    admin.dispose()


def create_test_database(directory: Path) -> TestDatabase:
    """An empty database with the engine's tables, per GENEVA_TEST_DATABASE_URL."""
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
        Base.metadata.create_all(engine)
        return TestDatabase(engine, url, schema)
    if url and is_mysql_url(url):
        name, database_url = create_mysql_database(url)
        engine = db.make_engine(database_url, pool_size=10, max_overflow=20)
        Base.metadata.create_all(engine)
        return TestDatabase(engine, url, None, database=name)
    path = directory / "geneva.sqlite3"
    sqlite_url = f"sqlite:///{path}"
    engine = db.make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    return TestDatabase(engine, sqlite_url, None)


@pytest.fixture
def geneva_database(tmp_path: Path) -> Iterator[TestDatabase]:
    database = create_test_database(tmp_path)
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
