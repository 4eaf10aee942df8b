"""The ``geneva_session`` pytest fixture (registered through the ``pytest11`` entry point).

Each test gets an empty database holding every table of ``geneva_drive.models.Base.metadata`` (so a
test may map its own hero models on ``Base``): a new SQLite file in WAL mode by default, or a
fresh PostgreSQL schema when ``GENEVA_TEST_DATABASE_URL`` points at PostgreSQL. The engine's
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

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.models import Base


@dataclass
class TestDatabase:
    engine: Engine
    url: str
    schema: str | None

    def dispose(self) -> None:
        self.engine.dispose()
        if self.schema is not None:
            admin = db.make_engine(self.url)
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
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
