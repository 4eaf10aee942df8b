"""The engine's own database wiring: engine, session factory and row locks.

The engine works without Flask (workers, the dispatcher, scripts) through the session factory
configured here. ``configure(url)`` is called once per process (the CLI, the Celery app, the
dashboard factory, the test fixture); ``GENEVA_DATABASE_URL`` is the default.

Locking. PostgreSQL, MariaDB and MySQL get ``SELECT … FOR UPDATE``. SQLite has no row locks: a "lock" there
means holding the database write lock, taken with ``BEGIN IMMEDIATE`` at the start of the lock
section (pysqlite's legacy transaction mode only opens a transaction at the first write, so a
section that reads before it writes would otherwise run outside any transaction and another
writer could slip in between). WAL mode lets readers go on meanwhile; ``busy_timeout`` makes a
second writer wait instead of failing.

Liveness (server databases). A pooled connection can be dead when it is checked out (the server
restarted, an idle timeout closed it). SQLAlchemy's ``pool_pre_ping`` tests every checkout with a
round trip; a worker checks a connection out twice per step (prepare, then finalize), so that
is two round trips per step for connections that were in use milliseconds ago. Here a checkout
pings only a connection that sat idle in the pool for longer than ``GENEVA_POOL_PING_AFTER``
seconds (0.5 by default, HikariCP's ``aliveBypassWindowMs``); a dead one is replaced before the
caller sees it, as with ``pool_pre_ping``. ``GENEVA_POOL_PING_AFTER=0`` pings every checkout.

MariaDB and MySQL (``mysql+pymysql://user:password@host:3306/database``; ``mariadb+pymysql://``
works too). Connections run at READ COMMITTED, not InnoDB's default REPEATABLE READ, on purpose:

- The engine's read-after-conflict paths need to see rows other transactions committed after
  this one began: a signal whose idempotency key lost the race to a concurrent delivery reads
  the winner's row after the duplicate-key error (REPEATABLE READ would read from the
  transaction's first snapshot and find nothing), and a workflow lock taken after waiting
  must be read with the state the other side committed. PostgreSQL, where the engine was
  written, runs READ COMMITTED by default; every lock section was designed for it.
- Measured (issue 19): at REPEATABLE READ tests/engine/test_signals_race.py fails on MariaDB.
  A gate that parks its step reads the workflow's signals in a snapshot older than a signal
  committed meanwhile, and no one wakes the step: a lost wake-up.
- REPEATABLE READ makes locking reads and unique checks take gap and next-key locks: two
  workers inserting the next executions of different workflows, or the dispatcher's
  ``FOR UPDATE SKIP LOCKED`` scan, then lock ranges of the (state, scheduled_for) and
  one-active indexes and deadlock against each other. READ COMMITTED locks only the rows
  it reads and releases those a scan did not keep.

The session's time zone is UTC (``SET time_zone = '+00:00'``): DATETIME columns hold naive UTC,
and the server's own clock functions must agree with them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from geneva_drive.errors import ConfigurationError

#: The embedded default's file (relative to the current directory). Only ``geneva-drive up`` and
#: ``geneva-drive migrate`` use it by themselves; every other role must be told its database.
EMBEDDED_DATABASE_PATH = Path("var") / "geneva_drive.sqlite3"
SQLITE_BUSY_TIMEOUT_MS = 30_000
DEFAULT_POOL_PING_AFTER = 0.5
#: The isolation level of MariaDB/MySQL connections (see the module docstring).
MYSQL_ISOLATION_LEVEL = "READ COMMITTED"
MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})

_lock = threading.Lock()
_engine: Engine | None = None
SessionFactory: sessionmaker[Session] = sessionmaker(expire_on_commit=False)


def database_url() -> str:
    """``GENEVA_DATABASE_URL``; refused when unset, never a silent SQLite file.

    A worker or web process that fell back to a fresh SQLite file would start, find no tables
    (or another process's empty file) and fail on every step instead of at start.
    """
    url = os.environ.get("GENEVA_DATABASE_URL", "").strip()
    if url:
        return url
    raise ConfigurationError(
        "GENEVA_DATABASE_URL is not set. Set it to the workflow database, e.g. "
        "GENEVA_DATABASE_URL=postgresql+psycopg://user@host/dbname, or run `geneva-drive up`, "
        f"the embedded default, which keeps a SQLite file at ./{EMBEDDED_DATABASE_PATH}. "
        "(With the Flask extension, GenevaDrive(app, db=db) uses the host's database instead.)"
    )


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an SQLAlchemy engine with the engine's SQLite pragmas applied."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        engine = create_engine(url, **kwargs)
        install_sqlite_pragmas(engine)
        return engine
    if parsed.get_backend_name() in MYSQL_DIALECTS:
        kwargs = mysql_engine_options(url, kwargs)
    try:
        if "pool_pre_ping" in kwargs:  # the caller chose SQLAlchemy's own check
            return create_engine(url, **kwargs)
        engine = create_engine(url, **kwargs)
    except ModuleNotFoundError as error:
        driver = parsed.get_driver_name()
        raise RuntimeError(
            f"the database URL {parsed.render_as_string(hide_password=True)!r} needs the Python "
            f"driver {driver!r}, which is not installed ({error.name}). For MariaDB/MySQL use "
            f"GENEVA_DATABASE_URL=mysql+pymysql://user:password@host:3306/database (PyMySQL "
            f"comes with geneva-drive); for PostgreSQL postgresql+psycopg://…"
        ) from error
    install_idle_ping(engine, pool_ping_after())
    return engine


def mysql_engine_options(url: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``create_engine`` options with the MariaDB/MySQL defaults added: READ COMMITTED,
    utf8mb4 and a UTC session (module docstring). What the URL or ``options`` set wins.

    The dashboard passes its ``SQLALCHEMY_ENGINE_OPTIONS`` through here, so the engine it
    hands to the workers of ``geneva-drive up`` behaves as one from :func:`make_engine`.
    """
    query = make_url(url).query
    merged = dict(options or {})
    merged.setdefault("isolation_level", MYSQL_ISOLATION_LEVEL)
    connect_args = dict(merged.get("connect_args") or {})
    if "charset" not in query:
        connect_args.setdefault("charset", "utf8mb4")
    if "init_command" not in query:
        connect_args.setdefault("init_command", "SET time_zone = '+00:00'")
    merged["connect_args"] = connect_args
    return merged


def is_mysql_url(url: str | None) -> bool:
    return bool(url) and make_url(url or "").get_backend_name() in MYSQL_DIALECTS


def pool_ping_after() -> float:
    raw = os.environ.get("GENEVA_POOL_PING_AFTER", "").strip()
    if not raw:
        return DEFAULT_POOL_PING_AFTER
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(
            f"GENEVA_POOL_PING_AFTER={raw!r} is not a number of seconds >= 0 (0 tests every "
            f"pooled connection at checkout; the default is {DEFAULT_POOL_PING_AFTER})"
        )
    return value


_RETURNED = "geneva_returned_at"


def install_idle_ping(engine: Engine, after: float) -> None:
    """Test a pooled connection at checkout when it sat idle for more than ``after`` seconds."""

    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED)
        if returned is not None and time.monotonic() - returned <= after:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            if not engine.dialect.is_disconnect(error, dbapi_connection, None):
                raise
            alive = False
        if not alive:
            # The pool discards this connection and checks out (or opens) another one.
            raise exc.DisconnectionError("pooled connection failed its liveness check")


def install_sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()


def configure(url: str | None = None, *, engine: Engine | None = None, **kwargs: Any) -> Engine:
    """Point the engine's session factory at a database (an URL or an existing engine)."""
    global _engine
    with _lock:
        if engine is None:
            engine = make_engine(url or database_url(), **kwargs)
        _engine = engine
        SessionFactory.configure(bind=engine)
        return engine


def get_engine() -> Engine:
    """The configured engine; configures from ``GENEVA_DATABASE_URL`` on first use."""
    if _engine is None:
        return configure()
    return _engine


def new_session() -> Session:
    get_engine()
    return SessionFactory()


@contextmanager
def transaction() -> Iterator[Session]:
    """An entry point's unit of work: a new session, committed on success, rolled back on error."""
    session = new_session()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


#: InnoDB's deadlock victim (1213) and lock wait timeout (1205); PostgreSQL's deadlock_detected.
_MYSQL_RETRYABLE = frozenset({1205, 1213})
_PG_RETRYABLE = frozenset({"40P01"})


def is_deadlock(error: BaseException) -> bool:
    """Whether ``error`` is the database choosing this transaction as a deadlock victim.

    InnoDB does so even between transactions that take their row locks in the same order (its
    unique-index checks lock neighbouring entries); the transaction rolled back whole, and the
    documented remedy is to run it again. Callers that own a transaction (an operator action,
    a webhook's ``signal()``) retry it on this.
    """
    original = getattr(error, "orig", error)
    args = getattr(original, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_RETRYABLE:
        return True
    return getattr(original, "sqlstate", None) in _PG_RETRYABLE


def is_sqlite(session: Session) -> bool:
    bind = session.get_bind()
    return bind.dialect.name == "sqlite"


def backend(session: Session) -> str:
    """``sqlite``, ``postgresql``, ``mariadb`` or ``mysql`` (MySQL proper) for this session.

    SQLAlchemy names both MySQL and MariaDB ``mysql`` (or ``mariadb`` for ``mariadb://``
    URLs) and tells them apart by the server version it reads on the first connection.
    """
    return dialect_backend(session.get_bind().dialect)


def dialect_backend(dialect: Any) -> str:
    if dialect.name in MYSQL_DIALECTS:
        return "mariadb" if getattr(dialect, "is_mariadb", False) else "mysql"
    return str(dialect.name)


def is_mysql_family(session: Session) -> bool:
    """MariaDB or MySQL: row locks and SKIP LOCKED as on PostgreSQL, no partial indexes."""
    return session.get_bind().dialect.name in MYSQL_DIALECTS


def begin_write(session: Session) -> None:
    """Make sure the session holds the database write lock (SQLite) before a lock section.

    On PostgreSQL this is a no-op: row locks are taken with ``FOR UPDATE`` by the caller.
    """
    if not is_sqlite(session):
        return
    connection = session.connection()
    dbapi_connection = connection.connection.dbapi_connection
    if dbapi_connection is not None and not dbapi_connection.in_transaction:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def plain_session(session: Session | scoped_session[Any]) -> Session:
    """The ``Session`` behind a ``scoped_session`` (Flask-SQLAlchemy's ``db.session``), or
    ``session`` itself: everything that takes a session accepts either."""
    if isinstance(session, scoped_session):
        inner: Session = session()
        return inner
    return session


# Current-session fallback: Workflow.create() and friends accept an explicit session, else the
# hero's own session, else this one (the test fixture and scripts set it).
_current = threading.local()


def set_current_session(session: Session | None) -> None:
    _current.session = session


def current_session() -> Session | None:
    return getattr(_current, "session", None)
