"""The engine's own database wiring: engine, session factory and row locks.

The engine works without Flask (workers, the dispatcher, scripts) through the session factory
configured here. ``configure(url)`` is called once per process (the CLI, the Celery app, the
dashboard factory, the test fixture); ``GENEVA_DATABASE_URL`` is the default.

Locking. PostgreSQL, MariaDB and MySQL get ``SELECT … FOR UPDATE``; SQLite, which has no row
locks, holds the database write lock from :func:`begin_write` on. What differs per database
(locks, session settings, types, statements) is in :mod:`geneva_drive.dialects`, one module
per backend; nothing here or elsewhere in the engine tests a database's name.

Liveness (server databases). A pooled connection can be dead when it is checked out (the server
restarted, an idle timeout closed it). SQLAlchemy's ``pool_pre_ping`` tests every checkout with a
round trip; a worker checks a connection out twice per step (prepare, then finalize), so that
is two round trips per step for connections that were in use milliseconds ago. Here a checkout
pings only a connection that sat idle in the pool for longer than ``GENEVA_POOL_PING_AFTER``
seconds (0.5 by default, HikariCP's ``aliveBypassWindowMs``); a dead one is replaced before the
caller sees it, as with ``pool_pre_ping``. ``GENEVA_POOL_PING_AFTER=0`` pings every checkout.

MariaDB and MySQL (``mysql+pymysql://user:password@host:3306/database``; ``mariadb+pymysql://``
works too) run at READ COMMITTED in a UTC session: why, in :mod:`geneva_drive.dialects.mysql`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from geneva_drive.config import process_variable
from geneva_drive.dialects import backend_name, dialect_for, dialect_for_url
from geneva_drive.errors import ConfigurationError

#: The embedded default's file (relative to the current directory). Only ``geneva-drive up`` and
#: ``geneva-drive migrate`` use it by themselves; every other role must be told its database.
EMBEDDED_DATABASE_PATH = Path("var") / "geneva_drive.sqlite3"
DEFAULT_POOL_PING_AFTER = 0.5

_lock = threading.Lock()
_engine: Engine | None = None
SessionFactory: sessionmaker[Session] = sessionmaker(expire_on_commit=False)


def database_url() -> str:
    """``GENEVA_DATABASE_URL``; refused when unset, never a silent SQLite file.

    A worker or web process that fell back to a fresh SQLite file would start, find no tables
    (or another process's empty file) and fail on every step instead of at start.
    """
    url = process_variable("GENEVA_DATABASE_URL")
    if url:
        return url
    raise ConfigurationError(
        "GENEVA_DATABASE_URL is not set. Set it to the workflow database, e.g. "
        "GENEVA_DATABASE_URL=postgresql+psycopg://user@host/dbname, or run `geneva-drive up`, "
        f"the embedded default, which keeps a SQLite file at ./{EMBEDDED_DATABASE_PATH}. "
        "(With the Flask extension, GenevaDrive(app, db=db) uses the host's database instead.)"
    )


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an SQLAlchemy engine with its database's connection settings applied."""
    parsed = make_url(url)
    dialect = dialect_for_url(url)
    kwargs = dialect.engine_options(url, kwargs)
    try:
        engine = create_engine(url, **kwargs)
    except ModuleNotFoundError as error:
        driver = parsed.get_driver_name()
        raise ConfigurationError(
            f"the database URL {parsed.render_as_string(hide_password=True)!r} needs the Python "
            f"driver {driver!r}, which is not installed ({error.name}). For MariaDB/MySQL use "
            f"GENEVA_DATABASE_URL=mysql+pymysql://user:password@host:3306/database (PyMySQL "
            f"comes with geneva-drive); for PostgreSQL postgresql+psycopg://…"
        ) from error
    dialect.install(engine)
    if dialect.idle_ping and "pool_pre_ping" not in kwargs:  # else the caller chose SQLAlchemy's
        install_idle_ping(engine, pool_ping_after())
    return engine


def pool_ping_after() -> float:
    raw = process_variable("GENEVA_POOL_PING_AFTER")
    if not raw:
        return DEFAULT_POOL_PING_AFTER
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigurationError(
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


def serves_threads(bind: Any) -> bool:
    """Can ``bind`` give two threads a connection each at once? An engine with a real pool
    can; one whose pool holds one connection for everyone (``StaticPool``: an in-memory
    SQLite, a test's shared connection; ``SingletonThreadPool``) or a bare ``Connection`` (a
    session bound to a host's test transaction) cannot, and a statement sent beside another
    there would run on the same connection."""
    return isinstance(bind, Engine) and not isinstance(bind.pool, StaticPool | SingletonThreadPool)


_beside: tuple[int, futures.ThreadPoolExecutor] | None = None
_beside_lock = threading.Lock()

T = TypeVar("T")


def run_beside(fn: Callable[..., T], *args: Any, **kwargs: Any) -> futures.Future[T]:
    """``fn(*args, **kwargs)`` in a thread of this process's small pool, for a read that runs
    on a connection of its own beside the caller's statements (the overview's snapshot, the
    unexplained count). The pool is made per process: one inherited through ``fork`` (a
    prefork worker, a preloading web server) would believe in threads the child does not have
    and never run the work."""
    global _beside
    with _beside_lock:
        if _beside is None or _beside[0] != os.getpid():
            _beside = (
                os.getpid(),
                futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="geneva-drive-beside"),
            )
        pool = _beside[1]
    return pool.submit(fn, *args, **kwargs)


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


def backend(session: Session) -> str:
    """``sqlite``, ``postgresql``, ``mariadb`` or ``mysql`` (MySQL proper) for this session:
    for labels and messages; ask :func:`geneva_drive.dialects.dialect_for` what it can do."""
    return backend_name(session)


def begin_write(session: Session) -> None:
    """Make sure the session holds the database write lock (SQLite) before a lock section.

    With row locks (PostgreSQL, MariaDB, MySQL) this is a no-op: they are taken with
    ``FOR UPDATE`` by the caller.
    """
    dialect_for(session).begin_write(session)


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
