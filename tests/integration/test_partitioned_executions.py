"""The manual's "PostgreSQL with time-partitioned executions", run as written.

The conversion SQL and the month's drop are read from docs/MANUAL.md itself (the same reader
``bench/probe_partition_drop.py`` measures them with), applied to a database ``geneva-drive
migrate``-d for the test, and the engine then runs on it: a workflow through a signal wait to
its end, the archive CLI out and back in (a restored execution lands in its month's
partition), and the drop of a month followed by housekeeping's cleanup. PostgreSQL only: it
runs in the suite's PostgreSQL pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text, update
from sqlalchemy.engine import make_url

from bench.probe_partition_drop import manual_sql, partition_statements
from geneva_drive import Workflow, db, housekeeping, migrations, step
from geneva_drive.config import settings
from geneva_drive.housekeeping import HousekeepingReport
from geneva_drive.models import Base, StepExecution
from geneva_drive.testing import (
    assert_waiting_for_signal,
    perform_next_step,
    pytest_plugin,
    speedrun_workflow,
)
from tests.backends import url_backend
from tests.engine.helpers import make_order

pytestmark = pytest.mark.skipif(
    url_backend() != "postgresql", reason="partitioning is PostgreSQL's: runs in its pass"
)

OCTOBER = "geneva_drive_step_executions_2026_10"
IN_OCTOBER = datetime(2026, 10, 14, 12, 0, tzinfo=UTC)


class PartitionedFlow(Workflow):
    @step
    def charge(self) -> None:
        pass

    @step(wait_for="confirmed")
    def confirm(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


@pytest.fixture
def geneva_database() -> Iterator[pytest_plugin.TestDatabase]:
    """A database of its own: migrated, converted with the manual's SQL, an October month
    added (the manual's conversion makes December and January, and the DEFAULT one)."""
    admin_url = os.environ["GENEVA_TEST_DATABASE_URL"]
    name = f"gd_partition_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    previous = db._engine
    try:
        migrations.upgrade(engine)
        with engine.begin() as connection:
            # The DBAPI cursor, without parameters: psycopg would read format()'s %I as one.
            conversion = manual_sql()[0].replace("BEGIN;", "").replace("COMMIT;", "")
            connection.connection.cursor().execute(conversion)
            connection.exec_driver_sql(
                f"CREATE TABLE {OCTOBER} PARTITION OF geneva_drive_step_executions"
                " FOR VALUES FROM ('2026-10-01 00:00+00') TO ('2026-11-01 00:00+00')"
            )
        Base.metadata.create_all(engine)  # the tests' hero tables (the engine's exist)
        db.configure(engine=engine)
        yield pytest_plugin.TestDatabase(engine=engine, url=url, schema=None)
    finally:
        if previous is not None:
            db.configure(engine=previous)
        engine.dispose()
        with admin.connect() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def _partition_of(session, execution_id: int) -> str:  # type: ignore[no-untyped-def]
    return str(
        session.execute(
            text("SELECT tableoid::regclass::text FROM geneva_drive_step_executions WHERE id = :i"),
            {"i": execution_id},
        ).scalar_one()
    )


def _finished_in_october(session) -> Workflow:  # type: ignore[no-untyped-def]
    """A workflow run to its end, then moved back to October: its executions (an UPDATE of
    the partition key moves each row to October's partition) and its end."""
    workflow = PartitionedFlow.create(hero=make_order(session))
    session.commit()
    perform_next_step(workflow)  # charge
    perform_next_step(workflow)  # confirm parks for its signal
    workflow.signal("confirmed")
    session.commit()
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
    _move_to_october(session, workflow)
    return workflow


def _move_to_october(session, workflow: Workflow) -> None:  # type: ignore[no-untyped-def]
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(created_at=IN_OCTOBER)
    )
    session.execute(
        update(Workflow).where(Workflow.id == workflow.id).values(transitioned_at=IN_OCTOBER)
    )
    session.commit()


def test_the_conversion_keeps_every_index_and_puts_the_partition_key_in_the_primary_key(
    geneva_session,
):
    kind = geneva_session.execute(
        text("SELECT relkind FROM pg_class WHERE relname = 'geneva_drive_step_executions'")
    ).scalar_one()
    assert kind == "p"
    found = set(
        geneva_session.execute(
            text(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'geneva_drive_step_executions'"
            )
        ).scalars()
    )
    expected = {i.name for i in Base.metadata.tables["geneva_drive_step_executions"].indexes}
    assert expected - found == set()
    primary_key = geneva_session.execute(
        text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE contype = 'p'"
            " AND conrelid = 'geneva_drive_step_executions'::regclass"
        )
    ).scalar_one()
    assert primary_key == "PRIMARY KEY (id, created_at)"


def test_a_workflow_waits_for_its_signal_and_finishes_on_partitioned_executions(
    geneva_session,
):
    workflow = PartitionedFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)  # charge
    perform_next_step(workflow)  # confirm parks for its signal
    assert_waiting_for_signal(workflow, "confirmed")
    workflow.signal("confirmed")
    geneva_session.commit()
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
    executions = geneva_session.scalars(
        StepExecution.__table__.select()
        .with_only_columns(StepExecution.id)
        .where(StepExecution.workflow_id == workflow.id)
    ).all()
    assert len(executions) == 3
    partitions = {_partition_of(geneva_session, e) for e in executions}
    # This month's partition, or the DEFAULT one once the manual's months have passed.
    now = datetime.now(UTC)
    month = f"geneva_drive_step_executions_{now:%Y_%m}"
    assert partitions <= {month, "geneva_drive_step_executions_default"}, partitions


def test_the_manuals_drop_of_a_month_then_cleanup_remove_its_workflows(geneva_session):
    ended = _finished_in_october(geneva_session)
    ongoing = PartitionedFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(ongoing)
    perform_next_step(ongoing)  # parked at confirm, its executions moved to October too
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == ongoing.id)
        .values(created_at=IN_OCTOBER)
    )
    geneva_session.commit()
    check, *drop = partition_statements(manual_sql()[1], OCTOBER)

    # An ongoing workflow has executions in the month: the check says it must stay.
    assert geneva_session.execute(text(check)).scalar_one() == 2
    ongoing.cancel()
    geneva_session.commit()
    assert geneva_session.execute(text(check)).scalar_one() == 2  # canceled, but not aged out
    _move_to_october(geneva_session, ongoing)
    assert geneva_session.execute(text(check)).scalar_one() == 0
    geneva_session.rollback()  # an open transaction on the table holds the DETACH off

    with db.get_engine().connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        for statement in drop:
            connection.exec_driver_sql(statement)
    assert geneva_session.execute(text("SELECT to_regclass(:t)"), {"t": OCTOBER}).scalar() is None

    ids = {"a": ended.id, "b": ongoing.id}
    settings.delete_completed_workflows_after = timedelta(days=30)
    report = HousekeepingReport()
    housekeeping.cleanup(datetime.now(UTC), report)
    assert report.workflows_cleaned_up == 2
    assert report.step_executions_cleaned_up == 0  # they went with the month
    left = geneva_session.execute(
        text("SELECT count(*) FROM geneva_drive_workflows WHERE id IN (:a, :b)"),
        ids,
    ).scalar_one()
    assert left == 0


def test_the_archive_writes_and_restores_partitioned_executions_into_their_month(
    geneva_session, geneva_database, tmp_path: Path
):
    workflow_id = _finished_in_october(geneva_session).id
    before = geneva_session.execute(
        text(
            "SELECT id, step_name, state, created_at FROM geneva_drive_step_executions"
            " WHERE workflow_id = :w ORDER BY id"
        ),
        {"w": workflow_id},
    ).all()
    geneva_session.rollback()
    # The archive job's signing key, which the restore checks (docs/MANUAL.md, "Retention and
    # archives").
    env = dict(
        os.environ,
        GENEVA_DATABASE_URL=geneva_database.url,
        GENEVA_ARCHIVE_KEY="partitioned-test-archive-key-0123456789abcdef",
    )
    cli = [sys.executable, "-m", "geneva_drive.dashboard.cli"]
    written = subprocess.run(
        [*cli, "archive", "--older-than", "30d", "--to", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert written.returncode == 0, written.stderr
    assert '"workflows": 1' in written.stdout, written.stdout
    gone = geneva_session.execute(
        text("SELECT count(*) FROM geneva_drive_step_executions WHERE workflow_id = :w"),
        {"w": workflow_id},
    ).scalar_one()
    assert gone == 0
    geneva_session.rollback()

    files = sorted(str(p) for p in tmp_path.glob("*.jsonl.gz"))
    restored = subprocess.run(
        [*cli, "archive", "--restore", *files], env=env, capture_output=True, text=True, timeout=120
    )
    assert restored.returncode == 0, restored.stderr
    after = geneva_session.execute(
        text(
            "SELECT id, step_name, state, created_at FROM geneva_drive_step_executions"
            " WHERE workflow_id = :w ORDER BY id"
        ),
        {"w": workflow_id},
    ).all()
    assert after == before
    assert {_partition_of(geneva_session, row.id) for row in after} == {OCTOBER}
