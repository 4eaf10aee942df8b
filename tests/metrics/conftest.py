"""Fixtures of the metrics tests: seeded rows and a statement counter."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session

from geneva_drive import metrics
from geneva_drive.models import utcnow
from geneva_drive.prometheus import clear_limit_cache
from tests.metrics.seed import seed


class StatementCounter:
    """Counts the SQL statements an engine runs (``before_cursor_execute``)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        self.statements.append(statement)

    @property
    def count(self) -> int:
        return len(self.statements)

    def selects(self) -> list[str]:
        return [s for s in self.statements if s.lstrip().upper().startswith("SELECT")]


@pytest.fixture
def seeded(geneva_session: Session) -> datetime:
    now = utcnow()
    seed(geneva_session, now)
    return now


@pytest.fixture(autouse=True)
def _fresh_metrics_cache() -> Iterator[None]:
    """Every metrics test starts cold: the snapshot and the limit gauges each keep a
    process-wide cache, and one left warm by an earlier test on this worker could fall due
    between two scrapes of the next (a read where a test counts none)."""
    metrics.clear_cache()
    clear_limit_cache()
    yield
    metrics.clear_cache()
    clear_limit_cache()


@contextmanager
def counting(engine: Engine) -> Iterator[StatementCounter]:
    """``with counting(engine) as counter: ...``: the statements ``engine`` runs meanwhile."""
    counter = StatementCounter()
    event.listen(engine, "before_cursor_execute", counter)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter)


@pytest.fixture
def count_statements():  # type: ignore[no-untyped-def]
    """``with count_statements(engine) as counter: ...`` (:func:`counting` as a fixture)."""
    return counting
