"""Shared fixtures: hero models mapped on the engine's Base, and the geneva_session fixture
(from the geneva_drive.testing pytest plugin, registered via the pytest11 entry point); which
tests the PostgreSQL and MariaDB passes leave to the SQLite pass (``sqlite_pass``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive.models import Base
from tests.backends import url_backend
from tests.clock import FrozenClock


class Order(Base):
    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(32), default="new")


class Account(Base):
    __tablename__ = "test_accounts"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(String(255), default="a@example.com")


@pytest.fixture
def generous_inline_time_budget() -> Iterator[None]:
    """Inline successors get 60 s instead of 200 ms. Tests of the inline chain's path (not of
    its budget, whose own test passes ``max_seconds``) use it: on a loaded machine 200 ms can
    run out between two steps and hand the chain over to the dispatcher."""
    from geneva_drive.config import settings

    before = settings.inline_successor_max_time
    settings.inline_successor_max_time = timedelta(seconds=60)
    yield
    settings.inline_successor_max_time = before


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    """The engine's and the dashboard's "now", held at the real now until the test moves it
    (tests/clock.py): for assertions that read the time twice, or at an exact lateness."""
    return FrozenClock(monkeypatch)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``sqlite_pass`` tests do not use the suite's database (GENEVA_TEST_DATABASE_URL): the
    PostgreSQL and MariaDB passes would repeat them unchanged, so they run in the SQLite pass
    only (CONTRIBUTING "Which tests run where")."""
    if url_backend() == "sqlite":
        return
    skip = pytest.mark.skip(
        reason="runs once, in the SQLite pass: does not use the suite's database"
    )
    for item in items:
        if item.get_closest_marker("sqlite_pass"):
            item.add_marker(skip)
