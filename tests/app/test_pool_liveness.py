"""The dashboard's database engine gets the engine's idle-window liveness check (engine/db.py).

A connection killed while idle in the pool is replaced before a request uses it, so a
PostgreSQL restart between two page loads costs the operator no error page.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from tests.backends import connection_id, terminate


def test_a_connection_killed_while_idle_is_replaced_before_a_request_uses_it(
    app_factory, geneva_database, monkeypatch
):
    if geneva_database.schema is None and geneva_database.database is None:
        pytest.skip("connection liveness is for server databases; SQLite has no server")
    monkeypatch.setenv("GENEVA_POOL_PING_AFTER", "0.1")
    app = app_factory()
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    with app.app_context():
        from geneva_drive.dashboard.extensions import db

        pids = []
        held = [db.engine.connect() for _ in range(db.engine.pool.checkedin())]
        for connection in held:
            pids.append(connection_id(connection))
            connection.close()
    killer = create_engine(geneva_database.url, poolclass=NullPool)
    try:
        with killer.begin() as connection:
            for pid in pids:
                terminate(connection, pid)
    finally:
        killer.dispose()
    time.sleep(0.2)
    assert client.get("/healthz").status_code == 200
