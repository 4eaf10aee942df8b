"""The ``geneva_session`` pytest fixture (registered through the ``pytest11`` entry point).

Each test gets an empty database holding every table of ``geneva_drive.models.Base.metadata`` (so a
test may map its own hero models on ``Base``): a new SQLite file in WAL mode by default, or a
fresh PostgreSQL schema when ``GENEVA_TEST_DATABASE_URL`` points at PostgreSQL. The engine's
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
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, text
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.models import Base


@dataclass
class TestDatabase:
    engine: Engine
    url: str
    schema: str | None

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
