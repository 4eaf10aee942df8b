"""Fixtures of the reliability suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from geneva_drive import executor


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
