"""Fixtures of the reliability suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from geneva_drive import executor
from geneva_drive.dashboard import create_app
from geneva_drive.dashboard.extensions import db
from tests.app.conftest import app_config


@pytest.fixture
def rdb(geneva_database: Any, geneva_transport: Any, geneva_session: Any) -> Iterator[Engine]:
    """The test database (SQLite or PostgreSQL) with recorded transport and restored settings.

    Tests open their own sessions per thread through geneva_drive.db (each its own connection).
    """
    executor.clear_shutdown()
    yield geneva_database.engine
    executor.clear_shutdown()


# The real-process fixtures of the integration harness, for the crash and soak tests.
from tests.integration.conftest import (  # noqa: E402, F401
    processes,
    restore_settings,
    shared_database,
    short_horizon,
    use_transport,
)

#: The dashboard apps' secret key in the security suites (long enough to be accepted).
SECRET_KEY = "secret-key-0c9e77a1-long-enough"


@pytest.fixture
def build(geneva_database: Any, geneva_session: Any) -> Iterator[Any]:
    """``build(**config)``: a dashboard app on the test database; its pool is closed after."""
    made: list[Any] = []

    def make(**extra: Any) -> Any:
        config = app_config(geneva_database, **{"SECRET_KEY": SECRET_KEY, **extra})
        flask_app = create_app(config)
        made.append(flask_app)
        return flask_app

    yield make
    for flask_app in made:
        with flask_app.app_context():
            db.session.remove()
            db.engine.dispose()
