"""Which database the suite runs on, and the few server facilities tests use to watch it.

PostgreSQL and MariaDB/MySQL both have row locks, ``SKIP LOCKED`` and server sessions a test
can watch (is it waiting for a lock?) or end (a server-side disconnect); SQLite has none.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine.url import make_url

MYSQL_BACKENDS = ("mysql", "mariadb")
SERVER_BACKENDS = ("postgresql", *MYSQL_BACKENDS)


def url_backend() -> str:
    """``postgresql``, ``mysql`` (MariaDB or MySQL) or ``sqlite``, from GENEVA_TEST_DATABASE_URL."""
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if not url:
        return "sqlite"
    name = make_url(url).get_backend_name()
    return "mysql" if name in MYSQL_BACKENDS else name


def on_server_database() -> bool:
    """Row locks, SKIP LOCKED, real concurrency: PostgreSQL or MariaDB/MySQL."""
    return url_backend() in ("postgresql", "mysql")


SERVER_ONLY_REASON = (
    "needs GENEVA_TEST_DATABASE_URL on PostgreSQL or MariaDB (row locks, SKIP LOCKED)"
)


def _is_mysql(session: Any) -> bool:
    """For a Session or a Connection."""
    dialect = session.dialect if hasattr(session, "dialect") else session.get_bind().dialect
    return dialect.name in MYSQL_BACKENDS


def connection_id(session: Any) -> int:
    """The server's id of the session's connection (a PostgreSQL backend pid, a MariaDB thread)."""
    query = "SELECT CONNECTION_ID()" if _is_mysql(session) else "SELECT pg_backend_pid()"
    return int(session.execute(text(query)).scalar_one())


def waits_on_a_lock(monitor: Any, connection: int) -> bool:
    """Is server connection ``connection`` waiting for a row or index-entry lock right now?

    On MariaDB, ``innodb_trx`` shows ``LOCK WAIT`` for most waits, but a transaction whose
    first write is an INSERT waiting on another transaction's uncommitted unique-index entry
    can stay listed as ``RUNNING`` with no transaction id (seen on 10.11 under load, for 20 s
    until the other side committed). Its wait shows in the process list instead: the
    statement sits in the ``Update`` state."""
    if _is_mysql(monitor):
        state = monitor.execute(
            text(
                "SELECT trx_state FROM information_schema.innodb_trx "
                "WHERE trx_mysql_thread_id = :id"
            ),
            {"id": connection},
        ).scalar()
        if state == "LOCK WAIT":
            return True
        writing = monitor.execute(
            text(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE id = :id "
                "AND command = 'Query' AND state = 'Update' AND time_ms > 200"
            ),
            {"id": connection},
        ).scalar()
        return bool(writing)
    wait = monitor.execute(
        text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": connection}
    ).scalar()
    return wait == "Lock"


def lock_waiters(monitor: Any) -> int:
    """How many connections to the monitor's database wait for a row lock right now.

    MariaDB lists a transaction in ``innodb_trx`` only once it has written, and a locking read
    of a primary key waits in the optimizer's ``Statistics`` phase, so its wait shows in the
    process list: a ``FOR UPDATE`` read running for over 100 ms waits for its lock."""
    if _is_mysql(monitor):
        query = (
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() "
            "AND id <> CONNECTION_ID() AND command = 'Query' AND "
            "(state = 'Statistics' OR info LIKE '%FOR UPDATE%') AND time_ms > 100"
        )
    else:
        query = (
            "SELECT COUNT(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
    return int(monitor.execute(text(query)).scalar_one())


def terminate(session: Any, connection: int) -> None:
    """End server connection ``connection`` from the server side (a restart, an idle kill)."""
    if _is_mysql(session):
        session.execute(text(f"KILL CONNECTION {int(connection)}"))
    else:
        session.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": connection})
