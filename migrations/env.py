"""Alembic environment of the engine's own schema history (see ``__init__.py``).

It needs no Flask: the connection comes from the caller (:func:`geneva_drive.migrations.upgrade`
puts it in ``config.attributes``), else from Flask-Migrate's app when ``flask db`` runs it,
else from ``GENEVA_DATABASE_URL`` through the engine's own wiring. Its version table is
``geneva_drive_alembic_version``, and it only ever sees the engine's tables.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection, inspect, text

from geneva_drive import db
from geneva_drive.migrations import VERSION_TABLE, only_engine_tables
from geneva_drive.models import Base, autogenerate_filter

#: The one revision 0.1.0 recorded in the shared ``alembic_version`` table.
LEGACY_REVISIONS = ("0001",)


def _flask_engine() -> Any:
    try:
        from flask import current_app

        return current_app.extensions["migrate"].db.engine
    except (ImportError, RuntimeError, KeyError):
        return None


def _adopt_legacy_version(connection: Connection) -> None:
    """0.1.0 kept its revision in ``alembic_version``: carry it over to our own table once."""
    tables = set(inspect(connection).get_table_names())
    if VERSION_TABLE in tables or "geneva_drive_workflows" not in tables:
        return
    if "alembic_version" not in tables:
        return
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    legacy = [row for row in rows if row in LEGACY_REVISIONS]
    if not legacy:
        return
    # Alembic's own layout of a version table (what it would create on a first upgrade).
    connection.execute(
        text(
            f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
            f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
        )
    )
    connection.execute(
        text(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (:v)"), {"v": legacy[0]}
    )
    if len(rows) == 1:
        connection.execute(text("DROP TABLE alembic_version"))
    else:
        connection.execute(
            text("DELETE FROM alembic_version WHERE version_num = :v"), {"v": legacy[0]}
        )


def _configure(connection: Connection) -> None:
    extra: dict[str, Any] = {}
    flask_engine = _flask_engine()
    if flask_engine is not None:
        from flask import current_app

        extra = dict(current_app.extensions["migrate"].configure_args)
    # What this history is made of is not the caller's to change.
    for fixed in ("include_object", "version_table", "target_metadata", "connection"):
        extra.pop(fixed, None)
    extra.setdefault("compare_type", True)
    # The engine's tables only, each in this backend's form (MariaDB/MySQL: generated columns
    # where the others have partial indexes), so autogenerate compares like with like.
    backend_forms = autogenerate_filter(connection.dialect)

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
        return only_engine_tables(obj, name, type_, reflected, other) and bool(
            backend_forms(obj, name, type_, reflected, other)
        )

    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        **extra,
    )


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _adopt_legacy_version(connection)
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = _flask_engine() or db.get_engine()
    with engine.begin() as connection:
        _adopt_legacy_version(connection)
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=str(db.database_url()),
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=only_engine_tables,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
