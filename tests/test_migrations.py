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
from geneva_drive.models import Base

ENGINE_TABLES = {
    "geneva_drive_workflows",
    "geneva_drive_step_executions",
    "geneva_drive_signals",
    "geneva_drive_operator_actions",
    "geneva_drive_dashboard_sessions",
}


def _database_url(tmp_path):
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if url and url.startswith("postgresql"):
        return url, f"gd_mig_{uuid.uuid4().hex[:10]}"
    return f"sqlite:///{tmp_path / 'migrated.sqlite3'}", None


def test_upgrade_on_empty_database_matches_models(tmp_path):
    url, schema = _database_url(tmp_path)
    options = {}
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
                context = MigrationContext.configure(connection, opts={"compare_type": True})
                engine_only = Base.metadata
                diffs = [
                    d
                    for d in compare_metadata(context, engine_only)
                    if _table_of(d) is None or _table_of(d) in ENGINE_TABLES
                ]
            assert diffs == [], f"migration and models disagree: {diffs}"
            indexes = {
                i["name"] for i in inspect(db.engine).get_indexes("geneva_drive_step_executions")
            }
            assert "index_geneva_drive_step_executions_one_active" in indexes
            assert "index_geneva_drive_step_executions_in_progress_started_at" in indexes
    finally:
        with app.app_context():
            from geneva_drive.dashboard.extensions import db

            db.engine.dispose()
        if schema:
            admin = engine_db.make_engine(url)
            with admin.begin() as c:
                c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()


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
