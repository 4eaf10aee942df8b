"""The pytest plugin's per-test databases (geneva_drive.testing.pytest_plugin): each test gets
its own, cloned from a template, holding exactly the tables ``create_all`` makes, and nothing a
previous test wrote."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, inspect, text

from geneva_drive.models import Base
from geneva_drive.testing.pytest_plugin import create_test_database
from tests.conftest import Order


def _options(options: dict[str, Any] | None) -> str:
    """An index's dialect options as text (a partial index's WHERE is a TextClause)."""
    return repr(sorted((key, str(value)) for key, value in (options or {}).items()))


def _schema(engine: Engine) -> dict[str, Any]:
    """Every table's columns, primary key, indexes, unique constraints and foreign keys."""
    inspector = inspect(engine)
    described: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        described[table] = {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in inspector.get_columns(table)
            ],
            "pk": inspector.get_pk_constraint(table)["constrained_columns"],
            "indexes": sorted(
                (
                    i["name"],
                    tuple(i["column_names"]),
                    bool(i["unique"]),
                    _options(i.get("dialect_options")),
                )
                for i in inspector.get_indexes(table)
            ),
            "unique": sorted(
                (u["name"], tuple(u["column_names"]))
                for u in inspector.get_unique_constraints(table)
            ),
            "fks": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                for f in inspector.get_foreign_keys(table)
            ),
        }
    return described


def test_a_cloned_database_has_the_tables_create_all_makes(tmp_path: Path) -> None:
    """The clone (file copy, replayed DDL or SHOW CREATE TABLE) against create_all itself."""
    cloned = create_test_database(tmp_path / "cloned")
    reference = create_test_database(tmp_path / "reference")
    try:
        # The reference: a fresh create_all into an emptied second database.
        Base.metadata.drop_all(reference.engine)
        with reference.engine.connect() as connection:
            assert inspect(connection).get_table_names() == []
        Base.metadata.create_all(reference.engine)
        assert _schema(cloned.engine) == _schema(reference.engine)
    finally:
        cloned.dispose()
        reference.dispose()


def test_each_database_starts_empty_whatever_the_last_one_wrote(tmp_path: Path) -> None:
    first = create_test_database(tmp_path / "first")
    try:
        with first.engine.begin() as connection:
            connection.execute(Order.__table__.insert().values(status="written"))
    finally:
        first.dispose()
    second = create_test_database(tmp_path / "second")
    try:
        with second.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM test_orders")).scalar_one() == 0
    finally:
        second.dispose()


def test_a_hosts_extra_metadata_gets_its_tables_too(tmp_path: Path) -> None:
    """``geneva_metadata``'s tables come along on every backend (a template of their own)."""
    extra = MetaData()
    name = f"host_things_{uuid.uuid4().hex[:6]}"
    Table(name, extra, Column("id", Integer, primary_key=True), Column("label", String(20)))
    database = create_test_database(tmp_path, [extra])
    try:
        tables = set(inspect(database.engine).get_table_names())
        assert name in tables
        assert {table.name for table in Base.metadata.sorted_tables} <= tables
    finally:
        database.dispose()
