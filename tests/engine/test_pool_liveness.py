"""engine/db.py: a pooled PostgreSQL connection is tested at checkout only after sitting idle.

A connection back in the pool for less than ``GENEVA_POOL_PING_AFTER`` seconds is handed out
as is (no round trip); one idle for longer is pinged first, and a dead one is replaced before
the caller sees it - a server restart or an idle-connection timeout costs no failed step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine.url import make_url
from sqlalchemy.pool import NullPool

from engine import db

URL = os.environ.get("GENEVA_TEST_DATABASE_URL") or ""
pytestmark = pytest.mark.skipif(
    not URL or make_url(URL).get_backend_name() != "postgresql",
    reason="pool liveness is for server databases; needs GENEVA_TEST_DATABASE_URL on PostgreSQL",
)


@pytest.fixture
def counted(monkeypatch) -> Iterator[tuple[Engine, list[int]]]:
    monkeypatch.setenv("GENEVA_POOL_PING_AFTER", "0.2")
    engine = db.make_engine(URL, pool_size=1, max_overflow=0)
    pings: list[int] = []
    original = engine.dialect.do_ping

    def counting_ping(dbapi_connection):  # type: ignore[no-untyped-def]
        pings.append(1)
        return original(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counting_ping)
    try:
        yield engine, pings
    finally:
        engine.dispose()


def _backend(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pid: int) -> None:
    killer = create_engine(URL, poolclass=NullPool)
    try:
        with killer.begin() as connection:
            connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        killer.dispose()


def test_a_connection_back_in_the_pool_moments_ago_is_not_pinged(counted):
    engine, pings = counted
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
    time.sleep(0.3)
    second = _backend(engine)  # no error: the ping found it dead, the pool opened another
    assert second != first
    assert pings == [1]


def test_pool_ping_after_zero_pings_every_checkout(monkeypatch, counted):
    monkeypatch.setenv("GENEVA_POOL_PING_AFTER", "0")
    engine = db.make_engine(URL, pool_size=1, max_overflow=0)
    pings: list[int] = []
    original = engine.dialect.do_ping
    monkeypatch.setattr(
        engine.dialect, "do_ping", lambda connection: pings.append(1) or original(connection)
    )
    try:
        for _ in range(3):
            _backend(engine)
    finally:
        engine.dispose()
    assert len(pings) == 3


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_bad_setting_names_itself_and_the_way_out(monkeypatch, value):
    monkeypatch.setenv("GENEVA_POOL_PING_AFTER", value)
    with pytest.raises(ValueError, match=r"GENEVA_POOL_PING_AFTER=.* seconds >= 0"):
        db.make_engine(URL)
