"""``geneva-drive archive`` writes old finished/canceled workflows with their
executions and signals to gzip JSON Lines (one file per day), verifies the files, deletes the
rows, and ``--restore`` loads them back: into an empty database, equal to what was archived.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from geneva_drive import Workflow, archive, counts, db, housekeeping, step
from geneva_drive.config import settings
from geneva_drive.dashboard import cli, operator_cli
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.testing import speedrun_children, speedrun_workflow
from geneva_drive.testing.pytest_plugin import create_test_database
from tests.engine.helpers import make_order

TABLES = (Workflow.__table__, StepExecution.__table__, Signal.__table__)
#: The operator's signing key (GENEVA_ARCHIVE_KEY) for every test here.
KEY = "k" * 16 + "0123456789abcdef"


@pytest.fixture(autouse=True)
def _archive_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENEVA_ARCHIVE_KEY", KEY)


class ArchivedFlow(Workflow):
    @step
    def first(self) -> None:
        self.metadata_ = {"note": "ünïcode ✓", "nested": {"n": [1, 2.5, None]}}

    @step
    def second(self) -> None:
        pass


class ArchivedWait(Workflow):
    @step(wait_for="go")
    def gate(self) -> None:
        pass


class ArchivedKid(Workflow):
    @step
    def pack(self) -> None:
        pass


class ArchivedFanOut(Workflow):
    """A fan-out: two children, joined; its children end before it does."""

    @step
    def split(self) -> None:
        for _ in range(2):
            self.start_child(ArchivedKid, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def join(self) -> None:
        pass


def _rows(session: Session, ids: set[int] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every row of the three tables (of workflows ``ids``), by id: what must round-trip."""
    found = {}
    for table in TABLES:
        query = select(table).order_by(table.c.id)
        if ids is not None:
            owner = table.c.id if table is Workflow.__table__ else table.c.workflow_id
            query = query.where(owner.in_(ids))
        found[table.name] = [dict(row._mapping) for row in session.execute(query)]
    return found


def _exact(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(
        select(Workflow.type, Workflow.state, func.count()).group_by(Workflow.type, Workflow.state)
    )
    return {(t, s): int(n) for t, s, n in rows}


def _history(session: Session) -> dict[str, Any]:
    """Two finished workflows 40 days old, one 41 (two days), a canceled one with a signal
    (41 days), and what stays: a recent finished one and an old ongoing one."""
    made: dict[str, Any] = {"old": [], "kept": []}
    for days in (40, 40, 41):
        workflow = ArchivedFlow.create(hero=make_order(session), session=session)
        session.commit()
        speedrun_workflow(workflow)
        made["old"].append((workflow.id, days))
    waiting = ArchivedWait.create(hero=make_order(session), session=session)
    session.commit()
    waiting.signal("go", payload={"amount": 12}, idempotency_key="k-1")
    session.commit()
    waiting.cancel()
    session.commit()
    made["old"].append((waiting.id, 41))
    recent = ArchivedFlow.create(hero=make_order(session), session=session)
    session.commit()
    speedrun_workflow(recent)
    ongoing = ArchivedWait.create(hero=make_order(session), session=session)
    session.commit()
    made["kept"] = [recent.id, ongoing.id]
    now = utcnow()
    for workflow_id, days in made["old"]:
        session.execute(
            update(Workflow)
            .where(Workflow.id == workflow_id)
            .values(transitioned_at=now - timedelta(days=days))
        )
    session.execute(
        update(Workflow)
        .where(Workflow.id == ongoing.id)
        .values(transitioned_at=now - timedelta(days=50), created_at=now - timedelta(days=50))
    )
    session.commit()
    return made


@contextmanager
def _scope_on(engine: Any) -> Iterator[Session]:
    session = Session(bind=engine)
    try:
        yield session
    finally:
        session.close()


def test_archive_writes_verifies_deletes_and_restores_into_an_empty_database(
    geneva_session, tmp_path
):
    session = geneva_session
    made = _history(session)
    old_ids = {workflow_id for workflow_id, _days in made["old"]}
    before = _rows(session, old_ids)
    assert before["geneva_drive_signals"] and len(before["geneva_drive_step_executions"]) >= 7

    report = archive.archive(timedelta(days=30), tmp_path / "archive", batch=2)

    # One file per day of transitioned_at, each verified (its trailer matches its records).
    assert len(report.files) == 2
    assert all(path.name.startswith("geneva-drive-") for path in report.files)
    assert not list((tmp_path / "archive").glob("*.partial"))
    trailers = [archive.verify(path) for path in report.files]
    assert sum(t["workflows"] for t in trailers) == report.workflows == 4
    assert sum(t["step_executions"] for t in trailers) == report.step_executions
    assert report.step_executions == len(before["geneva_drive_step_executions"])
    assert report.signals == len(before["geneva_drive_signals"]) == 1
    # Deleted: exactly the archived workflows with their rows; the counts follow.
    session.expire_all()
    assert set(session.scalars(select(Workflow.id))) == set(made["kept"])
    assert _rows(session, old_ids) == {t.name: [] for t in TABLES}
    assert counts.read(session) == _exact(session)

    # Restored into an empty database: every row equal, the counts equal, ids usable.
    other = create_test_database(tmp_path / "restored")
    try:
        restored = archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        assert (restored.workflows, restored.skipped) == (4, 0)
        with _scope_on(other.engine) as fresh:
            assert _rows(fresh) == before
            assert counts.read(fresh) == _exact(fresh)
            assert sum(counts.read(fresh).values()) == 4
            # A new workflow after the restore gets a new id (PostgreSQL's sequences moved).
            created = ArchivedFlow.create(hero=make_order(fresh), session=fresh)
            fresh.commit()
            assert created.id not in old_ids
        # Run again: everything is there already, nothing doubles.
        again = archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        assert (again.workflows, again.skipped) == (0, 4)
        with _scope_on(other.engine) as fresh:
            assert (
                sum(counts.read(fresh).values()) == 5 == len(_rows(fresh)[Workflow.__tablename__])
            )
    finally:
        other.dispose()


def _sql_nulls(session: Session, ids: set[int] | None = None) -> dict[str, set[int]]:
    """Per JSON column (``table.column``): the ids of the rows where it IS NULL in SQL (the ORM
    reads a JSON ``null`` as None too, so ``_rows`` cannot tell them apart)."""
    from geneva_drive.models import JSONType

    found = {}
    for table in TABLES:
        for column in table.c:
            if not isinstance(column.type, JSONType):
                continue
            query = select(table.c.id).where(column.is_(None))
            if ids is not None:
                owner = table.c.id if table is Workflow.__table__ else table.c.workflow_id
                query = query.where(owner.in_(ids))
            found[f"{table.name}.{column.name}"] = set(session.scalars(query))
    return found


def test_an_empty_json_column_is_restored_empty_not_as_json_null(geneva_session, tmp_path):
    session = geneva_session
    made = _history(session)
    old_ids = {workflow_id for workflow_id, _days in made["old"]}
    before = _sql_nulls(session, old_ids)
    # The engine leaves the JSON columns of most rows empty (SQL NULL): a cursor, a payload, an
    # execution's metadata only where a step set them.
    assert before["geneva_drive_step_executions.cursor"]
    report = archive.archive(timedelta(days=30), tmp_path / "archive")
    other = create_test_database(tmp_path / "restored")
    try:
        archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        with _scope_on(other.engine) as fresh:
            assert _sql_nulls(fresh) == before
    finally:
        other.dispose()


def test_a_damaged_archive_is_refused_whole(geneva_session, tmp_path):
    _history(geneva_session)
    report = archive.archive(timedelta(days=30), tmp_path)
    damaged = report.files[0]
    lines = gzip.decompress(damaged.read_bytes()).splitlines(keepends=True)
    with gzip.open(damaged, "wb") as out:  # the trailer and one record lost: truncated
        out.writelines(lines[:-2])
    with pytest.raises(archive.ArchiveError, match="truncated"):
        archive.verify(damaged)
    other = create_test_database(tmp_path / "restored")
    try:
        with pytest.raises(archive.ArchiveError, match=str(damaged.name)):
            archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        with _scope_on(other.engine) as fresh:  # checked before anything was loaded
            assert fresh.scalar(select(func.count()).select_from(Workflow)) == 0
    finally:
        other.dispose()


def test_housekeeping_archives_when_a_directory_is_set(geneva_session, tmp_path):
    made = _history(geneva_session)
    settings.archive_completed_workflows_to = str(tmp_path / "kept")
    report = housekeeping.run()
    assert report.workflows_cleaned_up == 4
    files = sorted((tmp_path / "kept").glob("*.jsonl.gz"))
    assert len(files) == 2
    assert sum(archive.verify(path)["workflows"] for path in files) == 4
    geneva_session.expire_all()
    assert set(geneva_session.scalars(select(Workflow.id))) == set(made["kept"])


def test_the_command_archives_and_restores(geneva_session, tmp_path, capsys):
    _history(geneva_session)

    @contextmanager
    def scope() -> Iterator[Session]:
        with _scope_on(db.get_engine()) as session:
            yield session

    token = operator_cli.RUNTIME.set(lambda: operator_cli.Runtime(scope))
    try:

        def run(*argv: str) -> int:
            return cli._dispatch(cli._parser().parse_args(list(argv)))

        assert run("archive", "--older-than", "30d", "--to", str(tmp_path)) == 0
        assert '"workflows": 4' in capsys.readouterr().out
        assert run("archive", "--older-than", "thirty days", "--to", str(tmp_path)) == 2
        assert "30d, 12h" in capsys.readouterr().err
        assert run("archive", "--to", str(tmp_path)) == 2
        files = sorted(str(p) for p in Path(tmp_path).glob("*.jsonl.gz"))
        assert run("archive", "--restore", *files) == 0
        assert '"workflows": 4' in capsys.readouterr().out
        geneva_session.expire_all()
        assert geneva_session.scalar(select(func.count()).select_from(Workflow)) == 6
        assert counts.read(geneva_session) == _exact(geneva_session)
    finally:
        operator_cli.RUNTIME.reset(token)


def _fan_out(session: Session, layout: str) -> tuple[int, list[int]]:
    """A parent and its two children, ended 40-41 days ago in the order ``layout`` names:
    ``same day`` and ``child a day older`` are a finished fan-out (its children end first);
    ``parent a day older`` is a parent canceled before its children ended (they outlive it)."""
    parent = ArchivedFanOut.create(hero=make_order(session), session=session)
    session.commit()
    speedrun_workflow(parent)  # split; the join parks on the two children
    if layout == "parent a day older":
        parent.cancel()
        session.commit()
        speedrun_children(parent)
    else:
        speedrun_children(parent)
        speedrun_workflow(parent)
    session.expire_all()
    kids = list(session.scalars(select(Workflow.id).where(Workflow.parent_id == parent.id)))
    assert len(kids) == 2
    # Noon of a day 40 days ago: the minutes below stay on that day.
    noon = (utcnow() - timedelta(days=40)).replace(hour=12, minute=0, second=0, microsecond=0)
    ended: dict[int, datetime] = {
        "same day": {kids[0]: noon - timedelta(minutes=2), kids[1]: noon - timedelta(minutes=1)},
        "child a day older": {kids[0]: noon - timedelta(days=1), kids[1]: noon},
        "parent a day older": {kids[0]: noon, kids[1]: noon},
    }[layout]
    parent_ended = noon + timedelta(minutes=1)
    if layout == "parent a day older":
        parent_ended = noon - timedelta(days=1)
    for workflow_id, at in {**ended, parent.id: parent_ended}.items():
        session.execute(
            update(Workflow).where(Workflow.id == workflow_id).values(transitioned_at=at)
        )
    session.commit()
    return parent.id, kids


@pytest.mark.parametrize("layout", ["same day", "child a day older", "parent a day older"])
def test_a_fan_out_round_trips_with_its_parent_links(geneva_session, tmp_path, layout):
    """A child's parent_id (a foreign key) survives archive and restore whichever of parent
    and child is restored first: the rows are equal, parent_id and the child counters too."""
    session = geneva_session
    parent_id, kids = _fan_out(session, layout)
    ids = {parent_id, *kids}
    before = _rows(session, ids)
    assert [row["parent_id"] for row in before["geneva_drive_workflows"]] == [
        None,
        parent_id,
        parent_id,
    ]
    expected_state = "canceled" if layout == "parent a day older" else "finished"
    assert before["geneva_drive_workflows"][0]["state"] == expected_state

    report = archive.archive(timedelta(days=30), tmp_path / "archive")
    assert report.workflows == 3
    assert len(report.files) == (1 if layout == "same day" else 2)
    session.expire_all()
    assert _rows(session, ids) == {t.name: [] for t in TABLES}

    other = create_test_database(tmp_path / "restored")
    try:
        restored = archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        assert (restored.workflows, restored.skipped) == (3, 0)
        with _scope_on(other.engine) as fresh:
            assert _rows(fresh) == before
            assert counts.read(fresh) == _exact(fresh)
    finally:
        other.dispose()


def test_parent_links_are_restored_across_batches(geneva_session, tmp_path):
    """One workflow per transaction: each child goes in before its parent exists."""
    session = geneva_session
    parent_id, kids = _fan_out(session, "same day")
    before = _rows(session, {parent_id, *kids})
    report = archive.archive(timedelta(days=30), tmp_path / "archive")
    other = create_test_database(tmp_path / "restored")
    try:
        archive.restore(report.files, batch=1, session_scope=lambda: _scope_on(other.engine))
        with _scope_on(other.engine) as fresh:
            assert _rows(fresh) == before
    finally:
        other.dispose()


def test_a_restore_run_again_links_a_child_restored_before_its_parent(geneva_session, tmp_path):
    """The child's file restored alone (a restore that stopped): its parent is nowhere, so
    parent_id stays empty; run again with every file, the child is skipped and yet linked."""
    session = geneva_session
    parent_id, kids = _fan_out(session, "child a day older")
    before = _rows(session, {parent_id, *kids})
    report = archive.archive(timedelta(days=30), tmp_path / "archive")
    child_file = report.files[0]  # the older day: one child alone
    other = create_test_database(tmp_path / "restored")
    try:
        first = archive.restore([child_file], session_scope=lambda: _scope_on(other.engine))
        assert (first.workflows, first.skipped) == (1, 0)
        with _scope_on(other.engine) as fresh:
            assert [(r["id"], r["parent_id"]) for r in _rows(fresh)["geneva_drive_workflows"]] == [
                (kids[0], None)
            ]
        again = archive.restore(report.files, session_scope=lambda: _scope_on(other.engine))
        assert (again.workflows, again.skipped) == (2, 1)
        with _scope_on(other.engine) as fresh:
            assert _rows(fresh) == before
    finally:
        other.dispose()
