"""The one Alembic migration builds exactly the schema the models describe."""

from __future__ import annotations

import os
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask_migrate import upgrade
from sqlalchemy import inspect, text

from geneva_drive import db as engine_db
from geneva_drive.dashboard import create_app
from geneva_drive.dialects import dialect_for_url
from geneva_drive.models import MYSQL_FORMS, Base, autogenerate_filter
from geneva_drive.testing.pytest_plugin import create_mysql_database, drop_mysql_database

ENGINE_TABLES = {
    "geneva_drive_workflows",
    "geneva_drive_step_executions",
    "geneva_drive_signals",
    "geneva_drive_operator_actions",
    "geneva_drive_dashboard_sessions",
    "geneva_drive_limits",
    "geneva_drive_workflow_counts",
    "geneva_drive_execution_minutes",
    "geneva_drive_execution_hours",
    "geneva_drive_rollup_marks",
    "geneva_drive_workers",
    "geneva_drive_leases",
    "geneva_drive_schedules",
}


def _database_url(tmp_path):
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if url and url.startswith("postgresql"):
        return url, f"gd_mig_{uuid.uuid4().hex[:10]}"
    return f"sqlite:///{tmp_path / 'migrated.sqlite3'}", None


def test_upgrade_on_empty_database_matches_models(tmp_path):
    url, schema = _database_url(tmp_path)
    options = {}
    mysql_database = None
    admin_url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if admin_url and dialect_for_url(admin_url).name == "mysql":
        # MariaDB/MySQL: an empty database of its own (the migration's MySQL branches).
        mysql_database, url = create_mysql_database(admin_url, prefix="gd_mig")
    if schema:
        admin = engine_db.make_engine(url)
        with admin.begin() as c:
            c.execute(text(f'CREATE SCHEMA "{schema}"'))
        admin.dispose()
        options = {
            "SQLALCHEMY_ENGINE_OPTIONS": {"connect_args": {"options": f"-csearch_path={schema}"}}
        }
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, **options}, require_secret_key=False)
    try:
        with app.app_context():
            upgrade()
            from geneva_drive.dashboard.extensions import db

            with db.engine.connect() as connection:
                tables = set(inspect(connection).get_table_names())
                assert tables >= ENGINE_TABLES
                # The filter migrations/env.py gives autogenerate: each backend's form of the
                # partial indexes is compared only where it applies (models.autogenerate_filter).
                context = MigrationContext.configure(
                    connection,
                    opts={
                        "compare_type": True,
                        "include_object": autogenerate_filter(connection.dialect),
                    },
                )
                engine_only = Base.metadata
                diffs = [
                    d
                    for d in compare_metadata(context, engine_only)
                    if _table_of(d) is None or _table_of(d) in ENGINE_TABLES
                ]
                if connection.dialect.name == "sqlite":
                    # 0009 adds parent_id's reference in its column (no table rebuild on
                    # SQLite, which would cascade-delete executions); SQLAlchemy reflects a
                    # column-level reference without its name and ON DELETE, so that one is
                    # compared from SQLite's own catalogue instead.
                    diffs = [d for d in diffs if not _is_parent_fk(d)]
                    parent_fk = [
                        (row[2], row[3], row[4], row[6])
                        for row in connection.exec_driver_sql(
                            "PRAGMA foreign_key_list(geneva_drive_workflows)"
                        )
                    ]
                    assert parent_fk == [("geneva_drive_workflows", "parent_id", "id", "SET NULL")]
            assert diffs == [], f"migration and models disagree: {diffs}"
            indexes = {
                i["name"] for i in inspect(db.engine).get_indexes("geneva_drive_step_executions")
            }
            assert "index_geneva_drive_step_executions_one_active" in indexes
            assert "index_geneva_drive_step_executions_in_progress_started_at" in indexes
            if mysql_database is not None:
                _assert_mysql_forms(db.engine)
    finally:
        with app.app_context():
            from geneva_drive.dashboard.extensions import db

            db.engine.dispose()
        if schema:
            admin = engine_db.make_engine(url)
            with admin.begin() as c:
                c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()
        if mysql_database is not None:
            drop_mysql_database(admin_url, mysql_database)


def _is_parent_fk(diff):
    """An add_fk/remove_fk diff of workflows.parent_id → workflows.id."""
    if not isinstance(diff, tuple) or diff[0] not in ("add_fk", "remove_fk"):
        return False
    constraint = diff[1]
    return constraint.table.name == "geneva_drive_workflows" and [
        c.name for c in constraint.columns
    ] == ["parent_id"]


def _assert_mysql_forms(engine):
    """The migrated MariaDB/MySQL schema is the one create_all makes (models.MYSQL_FORMS):
    the generated columns, the indexes under the partial indexes' names, LONGTEXT JSON on
    MariaDB, DATETIME(6), a binary NO PAD collation."""
    inspector = inspect(engine)
    for form in MYSQL_FORMS:
        found = {i["name"]: i for i in inspector.get_indexes(form.table)}[form.name]
        assert tuple(found["column_names"]) == form.columns, found
        assert bool(found["unique"]) == form.unique
        if form.generated is not None:
            column = {c["name"]: c for c in inspector.get_columns(form.table)}[form.generated[0]]
            assert "computed" in column and column["computed"].get("persisted"), column
    with engine.connect() as connection:
        created = connection.execute(text("SHOW CREATE TABLE geneva_drive_step_executions")).one()[
            1
        ]
    assert "`started_at` datetime(6)" in created, created
    assert "COLLATE=utf8mb4_nopad_bin" in created or "COLLATE=utf8mb4_0900_bin" in created, created
    if engine.dialect.is_mariadb:
        assert "`cursor` longtext" in created and "json_valid" not in created, created


def _table_of(diff):
    """The table a compare_metadata() diff is about (None when it cannot tell)."""
    from sqlalchemy import Table

    item = diff[0] if isinstance(diff, list) else diff
    for part in item[1:]:
        if isinstance(part, Table):
            return part.name
        table = getattr(part, "table", None)
        if table is not None:
            return table.name
        if isinstance(part, str):
            return part
    return None


@pytest.mark.parametrize("table", sorted(ENGINE_TABLES))
def test_model_tables_are_in_the_engine_metadata(table):
    assert table in Base.metadata.tables


# --- living beside a host's own history ---------------------------------------------------------


@pytest.fixture
def bare_database(tmp_path):
    """An empty database: a SQLite file, or a fresh PostgreSQL schema."""
    url, schema = _database_url(tmp_path)
    if schema is None:
        engine = engine_db.make_engine(url)
        yield engine
        engine.dispose()
        return
    admin = engine_db.make_engine(url)
    with admin.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine = engine_db.make_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def test_the_engine_history_keeps_its_own_version_table(bare_database):
    from geneva_drive import migrations

    with bare_database.begin() as c:  # a host's history, already at its own revision
        c.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        c.execute(text("INSERT INTO alembic_version VALUES ('host_0007')"))
    migrations.upgrade(bare_database)
    with bare_database.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "host_0007"
        ours = c.execute(text(f"SELECT version_num FROM {migrations.VERSION_TABLE}")).scalar()
    assert ours == migrations.current(bare_database) == _head()
    assert set(inspect(bare_database).get_table_names()) >= ENGINE_TABLES
    migrations.upgrade(bare_database)  # a second run is a no-op


def test_a_0_1_database_moves_its_revision_to_the_engine_version_table(bare_database):
    """0.1.0 recorded revision 0001 in the shared alembic_version: carried over, not re-run."""
    from geneva_drive import migrations

    migrations.upgrade(bare_database, "0001")  # the schema 0.1.0 made ...
    with bare_database.begin() as c:  # ... and where 0.1.0 recorded it
        c.execute(text(f"DROP TABLE {migrations.VERSION_TABLE}"))
        c.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        c.execute(text("INSERT INTO alembic_version VALUES ('0001')"))
    migrations.upgrade(bare_database)  # would fail creating existing tables if it re-ran 0001
    tables = set(inspect(bare_database).get_table_names())
    assert "alembic_version" not in tables
    assert migrations.current(bare_database) == _head()
    assert tables >= ENGINE_TABLES


def test_0010_counts_the_workflows_already_kept(bare_database):
    """The counts table starts from the workflows the database holds."""
    from geneva_drive import migrations

    migrations.upgrade(bare_database, "0007")
    now = "2026-01-01 00:00:00"
    rows = [("A", "ready"), ("A", "performing"), ("A", "finished"), ("B", "paused")]
    with bare_database.begin() as c:
        for workflow_type, state in rows:
            c.execute(
                text(
                    "INSERT INTO geneva_drive_workflows (type, state, allow_multiple, created_at,"
                    " updated_at) VALUES (:t, :s, false, :now, :now)"
                ),
                {"t": workflow_type, "s": state, "now": now},
            )
    migrations.upgrade(bare_database, "0010")
    with bare_database.connect() as c:
        counted = c.execute(
            text(
                "SELECT type, state, SUM(count) FROM geneva_drive_workflow_counts GROUP BY type, state"
            )
        ).all()
    # ready and performing share the row "ongoing" (geneva_drive.counts.bucket)
    assert {(t, s): int(n) for t, s, n in counted} == {
        ("A", "ongoing"): 2,
        ("A", "finished"): 1,
        ("B", "paused"): 1,
    }


def _head():
    from alembic.script import ScriptDirectory

    from geneva_drive import migrations

    return ScriptDirectory(str(migrations.DIRECTORY)).get_current_head()


def test_a_host_autogenerate_leaves_the_engine_tables_alone(bare_database):
    from sqlalchemy import Column, Integer, MetaData, Table

    from geneva_drive import migrations

    migrations.upgrade(bare_database)
    host = MetaData()
    Table("shop_orders", host, Column("id", Integer, primary_key=True))
    with bare_database.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"include_object": migrations.exclude_engine_tables}
        )
        diffs = compare_metadata(context, host)
        unfiltered = compare_metadata(MigrationContext.configure(connection), host)
    assert [d[0] for d in diffs] == ["add_table"]  # only the host's own new table
    dropped = {d[1].name for d in unfiltered if d[0] == "remove_table"}
    assert dropped >= ENGINE_TABLES  # what a host would have been told to drop without it


def test_0009_keeps_the_rows_that_reference_workflows(bare_database):
    """Adding ``parent_id`` must not go through a rebuild of the workflows table on SQLite: with
    the engine's ``PRAGMA foreign_keys=ON`` the rebuild's ``DROP TABLE`` deleted every step
    execution and signal through their ``ON DELETE CASCADE`` (reviewer's F2)."""
    from geneva_drive import migrations

    migrations.upgrade(bare_database, "0008")
    now = "2026-01-01 00:00:00"
    with bare_database.begin() as c:
        c.execute(
            text(
                "INSERT INTO geneva_drive_workflows (id, type, state, allow_multiple, created_at,"
                " updated_at) VALUES (1, 'A', 'ready', false, :now, :now)"
            ),
            {"now": now},
        )
        c.execute(
            text(
                "INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state,"
                " scheduled_for, created_at, updated_at) VALUES (1, 'first', 'scheduled', :now,"
                " :now, :now)"
            ),
            {"now": now},
        )
        c.execute(
            text(
                "INSERT INTO geneva_drive_signals (workflow_id, name, created_at, updated_at)"
                " VALUES (1, 'paid', :now, :now)"
            ),
            {"now": now},
        )
    migrations.upgrade(bare_database, "0009")
    with bare_database.connect() as c:
        kept = [
            c.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
            for table in (
                "geneva_drive_workflows",
                "geneva_drive_step_executions",
                "geneva_drive_signals",
            )
        ]
    assert kept == [1, 1, 1]
    # The parent reference is a working foreign key: deleting the parent clears it.
    with bare_database.begin() as c:
        c.execute(
            text(
                "INSERT INTO geneva_drive_workflows (id, type, state, allow_multiple, created_at,"
                " updated_at, parent_id) VALUES (2, 'A', 'ready', false, :now, :now, 1)"
            ),
            {"now": now},
        )
        c.execute(text("DELETE FROM geneva_drive_workflows WHERE id = 1"))
        parent = c.execute(
            text("SELECT parent_id FROM geneva_drive_workflows WHERE id = 2")
        ).scalar_one()
    assert parent is None
