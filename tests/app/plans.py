"""The plans of the statements a dashboard page runs, for tests that a viewer's page or a
filter walks no whole table (tests/reliability/test_security_hardening.py,
tests/app/test_scale_plans.py, tests/reliability/test_security_sessions_and_hosts.py)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from tests.app.conftest import login


def page_plans(flask_app: Any, url: str) -> list[tuple[str, str]]:
    """The plan of every statement a GET of ``url`` runs.

    SQLite is the strict check: its plans name every walk of a whole table or index as
    ``SCAN``. On PostgreSQL, with a few test rows, the planner picks what is cheapest at that
    size, so sequential scans are disabled and only a scan that no index can replace remains
    (a walk of the primary key with a filter is not caught there; bench B8 measures that case
    at 1,000,000 workflows)."""
    from geneva_drive.dashboard.extensions import db

    with flask_app.app_context():
        engine = db.engine
    if engine.dialect.name in ("mysql", "mariadb"):
        pytest.skip(
            "MariaDB's optimizer picks full scans of a few test rows and has no switch like "
            "PostgreSQL's enable_seqscan; the same statements are checked on SQLite and PostgreSQL"
        )
    statements: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        client = login(flask_app.test_client(), "olga")
        assert client.get(url, headers={"HX-Request": "true"}).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    plans = []
    with engine.connect() as connection:
        sqlite = engine.dialect.name == "sqlite"
        if not sqlite:
            connection.exec_driver_sql("SET enable_seqscan = off")
        for statement, parameters in statements:
            explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
            rows = connection.exec_driver_sql(explain + statement, parameters).fetchall()
            plan = "\n".join(str(row[-1]) if sqlite else str(row[0]) for row in rows)
            plans.append((statement, plan))
        connection.rollback()
    return plans


def full_scans(plan: str, tables: tuple[str, ...]) -> list[str]:
    """The lines of ``plan`` that walk a whole table (or a whole index) of ``tables``."""
    found = []
    for line in plan.splitlines():
        for table in tables:
            # SQLite: "SCAN <table>" (a walk of the whole table or of a whole index);
            # PostgreSQL: "Seq Scan on <table>" even with sequential scans disabled.
            if f"SCAN {table}" in line or f"Seq Scan on {table}" in line:
                found.append(line.strip())
    return found
