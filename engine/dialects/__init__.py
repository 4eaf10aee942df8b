"""One module per database behind one interface (:class:`~geneva_drive.dialects.base.Dialect`).

The engine and the dashboard ask the dialect of their session, connection or engine
(:func:`dialect_for`) or of a database URL (:func:`dialect_for_url`) what to do; this package
is the only place that reads a database's name. Adding a database: CONTRIBUTING.md.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session, scoped_session

from geneva_drive.dialects import mysql, postgresql, sqlite
from geneva_drive.dialects.base import Dialect, Sweep, Write
from geneva_drive.errors import UnsupportedDatabaseError

#: Every backend, by the SQLAlchemy dialect names it serves.
_BY_NAME: dict[str, Dialect] = {
    name: module.DIALECT
    for module in (sqlite, postgresql, mysql)
    for name in module.DIALECT.sqlalchemy_names
}

#: SQLAlchemy's names of the backends with partial indexes (``Index.ddl_if(dialect=…)``).
PARTIAL_INDEX_DIALECTS = tuple(
    name for name, dialect in _BY_NAME.items() if dialect.partial_indexes
)


def _named(name: str) -> Dialect:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedDatabaseError(
            f"geneva_drive does not support the database {name!r}: use SQLite, PostgreSQL, "
            "MariaDB or MySQL (GENEVA_DATABASE_URL=postgresql+psycopg://…, mysql+pymysql://…, "
            "sqlite:///…)"
        ) from None


def sqlalchemy_dialect(bind: Any) -> SQLAlchemyDialect:
    """The SQLAlchemy dialect of a session, connection, engine (or a dialect itself)."""
    if isinstance(bind, Session | scoped_session):
        bind = bind.get_bind()
    found = getattr(bind, "dialect", bind)
    assert isinstance(found, SQLAlchemyDialect), f"no SQLAlchemy dialect on {bind!r}"
    return found


def dialect_for(bind: Any) -> Dialect:
    """The dialect of a session, connection, engine or SQLAlchemy dialect.

    One dictionary lookup: the backends are stateless singletons, so "chosen once per
    engine" costs nothing to repeat (the model types call this for every bound value).
    """
    if isinstance(bind, SQLAlchemyDialect):
        found = _BY_NAME.get(bind.name)
        if found is not None:
            return found
    return _named(sqlalchemy_dialect(bind).name)


def dialect_for_url(url: str) -> Dialect:
    """The dialect of a database URL (before any engine exists)."""
    return _named(make_url(url).get_backend_name())


def backend_name(bind: Any) -> str:
    """``sqlite``, ``postgresql``, ``mariadb`` or ``mysql`` (MySQL proper): for labels, logs
    and messages. SQLAlchemy names both MySQL and MariaDB ``mysql`` (or ``mariadb`` for
    ``mariadb://`` URLs) and tells them apart by the server version it reads on the first
    connection."""
    found = sqlalchemy_dialect(bind)
    if _named(found.name) is mysql.DIALECT:
        return "mariadb" if mysql.is_mariadb(found) else "mysql"
    return str(found.name)


__all__ = [
    "PARTIAL_INDEX_DIALECTS",
    "Dialect",
    "Sweep",
    "UnsupportedDatabaseError",
    "Write",
    "backend_name",
    "dialect_for",
    "dialect_for_url",
    "sqlalchemy_dialect",
]
