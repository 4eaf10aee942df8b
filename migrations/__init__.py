"""The engine's schema history (Alembic), shipped inside the package.

It has a version table of its own (:data:`VERSION_TABLE`), so it lives beside a host
application's own Alembic or Flask-Migrate history in the same database without either one
seeing the other's revisions. Three ways to run it:

- ``geneva-drive migrate`` (uses ``GENEVA_DATABASE_URL``);
- :func:`upgrade` from code, with an engine or a connection: a host's own migration can call
  ``geneva_drive.migrations.upgrade(op.get_bind())`` to put the engine's DDL into its own flow;
- ``flask db upgrade`` on the standalone dashboard (``create_app()``), through Flask-Migrate.

A host's ``env.py`` passes :func:`exclude_engine_tables` as ``include_object`` (or
``Migrate(app, db, include_object=exclude_engine_tables)``) so that its autogenerate leaves the
engine's tables to this history instead of proposing to drop them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import alembic.context
import alembic.op
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Connection, Engine

from geneva_drive.models import ENGINE_TABLE_NAMES

#: The engine's own Alembic version table (a host's history keeps ``alembic_version``).
VERSION_TABLE = "geneva_drive_alembic_version"
#: The directory holding ``env.py`` and ``versions/``.
DIRECTORY = Path(__file__).parent


def engine_table_names() -> frozenset[str]:
    """The tables this history owns: every table of the engine's own models."""
    return ENGINE_TABLE_NAMES | {VERSION_TABLE}


def _table_name(obj: Any, name: str | None, type_: str) -> str | None:
    if type_ == "table":
        return name
    table = getattr(obj, "table", None)
    return getattr(table, "name", None)


def exclude_engine_tables(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """``include_object`` for a host's autogenerate: everything but the engine's tables."""
    return _table_name(obj, name, type_) not in engine_table_names()


def only_engine_tables(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """``include_object`` for this history: the engine's tables only, never a host's."""
    return _table_name(obj, name, type_) in engine_table_names()


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic configuration for this history, bound to ``connection`` when given."""
    config = Config()
    config.set_main_option("script_location", str(DIRECTORY))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(bind: Engine | Connection, revision: str = "head") -> None:
    """Upgrade the engine's tables on ``bind`` (an engine, or a connection in a transaction).

    May be called from inside a host's own Alembic revision (``upgrade(op.get_bind())``): the
    engine's DDL then runs in the host's migration transaction.
    """
    with _nested_alembic_proxies():
        if isinstance(bind, Engine):
            with bind.begin() as connection:
                command.upgrade(alembic_config(connection), revision)
            return
        command.upgrade(alembic_config(bind), revision)


@contextmanager
def _nested_alembic_proxies() -> Iterator[None]:
    """Alembic's ``context`` and ``op`` are module-level proxies that a run installs and then
    deletes; a run nested in a host's migration would leave the host's run without them. Put
    back whatever the outer run had."""
    modules = (alembic.context, alembic.op)
    before = [dict(vars(module)) for module in modules]
    try:
        yield
    finally:
        for module, snapshot in zip(modules, before, strict=True):
            namespace = vars(module)
            for name, value in snapshot.items():
                if namespace.get(name) is not value:
                    namespace[name] = value


def current(bind: Engine | Connection) -> str | None:
    """The engine schema's revision on ``bind`` (``None`` before the first migration)."""

    def read(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

    if isinstance(bind, Engine):
        with bind.connect() as connection:
            return read(connection)
    return read(bind)
