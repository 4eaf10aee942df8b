"""Archives that cannot be forged, planted or bombed (docs/MANUAL.md, "Retention and archives").

Each crafted file here is built by the test from a real archive the engine wrote: decompressed,
changed as an attacker would (the trailer's counts and SHA-256 recomputed, which needs no key),
and compressed again. Restore must refuse it whole, with one line saying why, and insert nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, archive, db, step
from geneva_drive.dashboard import cli, operator_cli
from geneva_drive.models import Signal, StepExecution
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import make_order

KEY = "an-operator-held-secret-of-32+chars!"
TABLE_ORDER = (Signal.__table__, StepExecution.__table__, Workflow.__table__)


class SealedFlow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step(wait_for="go")
    def second(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENEVA_ARCHIVE_KEY", KEY)


def _finished(session: Any, count: int = 2) -> list[int]:
    ids = []
    for _ in range(count):
        workflow = SealedFlow.create(hero=make_order(session), session=session)
        session.commit()
        workflow.signal("go")  # buffered until `second` waits for it
        session.commit()
        speedrun_workflow(workflow)
        assert workflow.state == "finished"
        ids.append(workflow.id)
    return ids


def _archived(session: Any, directory: Path, count: int = 2) -> tuple[Path, list[int]]:
    """A signed archive of ``count`` finished workflows (deleted from the database)."""
    ids = _finished(session, count)
    report = archive.archive(timedelta(0), directory, now=_later())
    [path] = report.files
    return path, ids


def _later() -> Any:
    from geneva_drive.models import utcnow

    return utcnow() + timedelta(seconds=1)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]


def _forge(
    path: Path, change: Callable[[list[dict[str, Any]]], None], *, sign: bool = False
) -> None:
    """Rewrite ``path`` as an attacker would: records changed, the trailer's counts and digest
    recomputed (no key needed), the old signature kept; signed anew with the operator's key
    only when ``sign`` (an insider, or a file restored with --trust-unsigned)."""
    records = _lines(path)
    header, body = records[0], [r for r in records[1:] if not r.get("end")]
    old_signature = records[-1].get("hmac")
    change(body)
    encode = archive._line
    digest = hashlib.sha256()
    counts = dict.fromkeys(archive.TABLES, 0)
    for record in body:
        digest.update(encode(record))
        counts[record["table"]] += 1
    trailer: dict[str, Any] = {
        "end": True,
        "workflows": counts[archive.WORKFLOWS],
        "step_executions": counts[archive.EXECUTIONS],
        "signals": counts[archive.SIGNALS],
        "sha256": digest.hexdigest(),
    }
    if sign:
        trailer["hmac"] = archive._signature(KEY.encode(), encode(header), trailer)
    elif old_signature is not None:
        trailer["hmac"] = old_signature  # the attacker has no key: the old one stays
    path.write_bytes(gzip.compress(b"".join(encode(r) for r in [header, *body, trailer])))


def _rows() -> dict[str, int]:
    with db.new_session() as session:
        return {
            table.name: session.scalar(select(func.count()).select_from(table)) or 0
            for table in TABLE_ORDER
        }


def _run_cli(*argv: str) -> int:
    """``geneva-drive ARGV`` in this process, on the test's database."""

    @contextmanager
    def scope() -> Iterator[Session]:
        session = Session(bind=db.get_engine())
        try:
            yield session
        finally:
            session.close()

    token = operator_cli.RUNTIME.set(lambda: operator_cli.Runtime(scope))
    try:
        return cli._dispatch(cli._parser().parse_args(list(argv)))
    finally:
        operator_cli.RUNTIME.reset(token)


def _clear_tables() -> None:
    with db.transaction() as session:
        for table in TABLE_ORDER:
            session.execute(delete(table))


# --- 1. forged, unsigned and malformed files -----------------------------------------------------


def test_an_edited_file_with_its_digest_recomputed_is_refused_by_its_signature(
    geneva_session, tmp_path
):
    path, _ids = _archived(geneva_session, tmp_path)
    before = _rows()

    def revive(body: list[dict[str, Any]]) -> None:
        body[0]["row"]["state"] = "ready"

    _forge(path, revive)  # the old signature stays, over the new digest
    with pytest.raises(archive.ArchiveError, match="signature does not match"):
        archive.restore([path])
    assert _rows() == before


def test_an_unsigned_file_needs_trust_unsigned_and_the_command_says_so_in_one_line(
    geneva_session, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("GENEVA_ARCHIVE_KEY")
    path, ids = _archived(geneva_session, tmp_path)
    before = _rows()
    assert _run_cli("archive", "--restore", str(path)) == 2  # no key: which setting to set
    assert "GENEVA_ARCHIVE_KEY is not set" in capsys.readouterr().err
    monkeypatch.setenv("GENEVA_ARCHIVE_KEY", KEY)
    assert _run_cli("archive", "--restore", str(path)) == 1
    err = capsys.readouterr().err
    assert "is not signed" in err and "--trust-unsigned" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _rows() == before
    assert _run_cli("archive", "--restore", str(path), "--trust-unsigned") == 0
    assert _rows()["geneva_drive_workflows"] == before["geneva_drive_workflows"] + len(ids)


def test_a_short_key_is_refused_naming_the_setting(geneva_session, tmp_path, monkeypatch):
    monkeypatch.setenv("GENEVA_ARCHIVE_KEY", "short")
    _finished(geneva_session, 1)
    with pytest.raises(Exception, match="GENEVA_ARCHIVE_KEY is 5 characters"):
        archive.archive(timedelta(0), tmp_path, now=_later())


def _workflow_row(body: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r["row"] for r in body if r["table"] == archive.WORKFLOWS)


def _live_workflow(session: Any) -> int:
    live = SealedFlow.create(hero=make_order(session), session=session)
    session.commit()
    return int(live.id)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        (
            "a workflow made runnable",
            lambda body, live: _workflow_row(body).update(state="ready"),
            "is 'ready'; an archive holds only finished or canceled workflows",
        ),
        (
            "a scheduled execution",
            lambda body, live: next(r for r in body if r["table"] == archive.EXECUTIONS)[
                "row"
            ].update(state="scheduled"),
            "an archived execution is over",
        ),
        (
            "a signal for a live workflow outside the file",
            lambda body, live: next(r for r in body if r["table"] == archive.SIGNALS)["row"].update(
                workflow_id=live
            ),
            "which is not (before it) in this file",
        ),
        (
            "a type that is no class name",
            lambda body, live: _workflow_row(body).update(type='x"} 1\nfake_metric'),
            "is not a workflow class name",
        ),
        (
            "an id that is text",
            lambda body, live: _workflow_row(body).update(id="7; DROP TABLE"),
            "is not a whole number",
        ),
        (
            "an overlong step name",
            lambda body, live: next(r for r in body if r["table"] == archive.EXECUTIONS)[
                "row"
            ].update(step_name="s" * 300),
            "longer than 255",
        ),
        (
            "a timestamp that is not one",
            lambda body, live: _workflow_row(body).update(created_at="yesterday"),
            "is not a timestamp",
        ),
        (
            "a column of another schema",
            lambda body, live: _workflow_row(body).update(is_admin=True),
            "has no column 'is_admin'",
        ),
        (
            "a required column missing",
            lambda body, live: _workflow_row(body).pop("type"),
            "row without 'type'",
        ),
        (
            "a row twice",
            lambda body, live: body.append(body[1]),
            "appears twice",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_trusted_but_malformed_file_is_refused_whole_before_anything_is_inserted(
    geneva_session, tmp_path, capsys, name, change, message
):
    """Even a file restored with --trust-unsigned (or signed by an insider) must hold only
    terminal workflows and their own rows, each of its column's type and length."""
    path, _ids = _archived(geneva_session, tmp_path, count=3)
    live = _live_workflow(geneva_session)
    _forge(path, lambda body: change(body, live), sign=True)
    before = _rows()
    with pytest.raises(archive.ArchiveError, match=message.replace("(", r"\(").replace(")", r"\)")):
        archive.restore([path])
    assert _rows() == before
    assert _run_cli("archive", "--restore", str(path)) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _rows() == before


def test_an_id_collision_is_found_up_front_and_a_rerun_reports_it_again(geneva_session, tmp_path):
    """An execution id the database holds for another workflow: refused before any batch is
    committed, so running it again stops at the same check instead of half-way."""
    # Made first: its rows' ids differ from the archived ones (SQLite reuses freed ids).
    live = _live_workflow(geneva_session)
    path, _ids = _archived(geneva_session, tmp_path, count=3)
    with db.new_session() as session:
        taken = session.scalars(
            select(StepExecution.id).where(StepExecution.workflow_id == live)
        ).first()

    def collide(body: list[dict[str, Any]]) -> None:
        last = [r for r in body if r["table"] == archive.EXECUTIONS][-1]
        last["row"]["id"] = taken

    _forge(path, collide, sign=True)
    before = _rows()
    for _ in range(2):
        with pytest.raises(archive.ArchiveError, match=f"step_executions id {taken} already"):
            archive.restore([path], batch=1)
        assert _rows() == before


# --- 2. a planted link, a shared directory --------------------------------------------------------


def test_a_planted_partial_link_is_never_followed(geneva_session, tmp_path):
    directory = tmp_path / "archive"
    directory.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.gz"
    ids = _finished(geneva_session, 1)
    day = _day_of(geneva_session, ids[0])
    planted = directory / f"geneva-drive-{day}.jsonl.gz.partial"
    planted.symlink_to(elsewhere)  # dangling: open(..., "wb") would create `elsewhere`
    report = archive.archive(timedelta(0), directory, now=_later())
    assert not elsewhere.exists()
    assert planted.is_symlink()  # left alone
    [written] = report.files
    assert written.name == f"geneva-drive-{day}-2.jsonl.gz"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert archive.verify(written, key=KEY.encode())["workflows"] == 1
    assert report.workflows == 1


def _day_of(session: Any, workflow_id: int) -> str:
    with db.new_session() as fresh:
        at = fresh.scalar(select(Workflow.transitioned_at).where(Workflow.id == workflow_id))
    return at.date().isoformat()


def test_a_directory_writable_by_others_is_refused_and_nothing_is_deleted(geneva_session, tmp_path):
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, 0o777)
    _finished(geneva_session, 1)
    before = _rows()
    with pytest.raises(archive.ArchiveError, match=r"writable by other users.*chmod 700"):
        archive.archive(timedelta(0), directory, now=_later())
    assert _rows() == before
    assert list(directory.iterdir()) == []


# --- 3. a gzip bomb -----------------------------------------------------------------------------


def _bomb(path: Path, line: bytes) -> None:
    header = archive._line({"format": archive.FORMAT, "version": 1, "day": "2026-01-01"})
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(header)
        out.write(line)


def test_a_file_that_inflates_without_end_is_refused_before_it_is_read_whole(
    geneva_session, tmp_path, monkeypatch
):
    # One plausible record line a million times: tiny compressed, far more inflated. (A smaller
    # line cap makes the inflation budget, 100 x compressed + one line, quicker to reach.)
    monkeypatch.setattr(archive, "MAX_LINE_BYTES", 1024 * 1024)
    path = tmp_path / "bomb.jsonl.gz"
    _bomb(path, b'{"row":{},"table":"geneva_drive_signals"}\n' * 1_000_000)
    assert path.stat().st_size < 200 * 1024  # 42 MB inflated
    with pytest.raises(archive.ArchiveError, match="inflates to more than 100 times"):
        archive.verify(path)
    with pytest.raises(archive.ArchiveError, match="inflates to more than 100 times"):
        archive.restore([path], trust_unsigned=True)
    # One line longer than any row the engine writes.
    monkeypatch.setattr(archive, "MAX_INFLATION", 10**6)
    long_line = tmp_path / "line.jsonl.gz"
    _bomb(long_line, b'{"table":"' + b"a" * (2 * 1024 * 1024) + b'"}\n')
    with pytest.raises(archive.ArchiveError, match="a line longer than 1 MiB"):
        archive.verify(long_line)


# --- a fuzz of restore ----------------------------------------------------------------------------


MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["drop", "duplicate", "set", "byte"]),
        st.integers(min_value=0, max_value=50),
        st.sampled_from(["id", "workflow_id", "state", "type", "step_name", "created_at", "name"]),
        st.one_of(
            st.none(),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.text(max_size=300),
            st.booleans(),
            st.sampled_from(["ready", "finished", "scheduled", "consumed", "2026-01-01T00:00:00"]),
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutations=MUTATIONS)
def test_restore_of_a_mutated_file_never_tracebacks_and_never_inserts_part_of_it(
    geneva_session, tmp_path, mutations
):
    """Any mutation of a trusted file: restore either loads the whole file or refuses it with
    ArchiveError, inserting nothing of it."""
    _clear_tables()
    path = tmp_path / "fuzzed.jsonl.gz"
    if not path.with_suffix(".orig").exists():
        original, _ids = _archived(geneva_session, tmp_path / "made", count=2)
        path.with_suffix(".orig").write_bytes(original.read_bytes())
    path.write_bytes(path.with_suffix(".orig").read_bytes())
    _clear_tables()

    def mutate(body: list[dict[str, Any]]) -> None:
        for kind, index, column, value in mutations:
            if not body:
                return
            target = body[index % len(body)]
            if kind == "drop":
                body.remove(target)
            elif kind == "duplicate":
                body.append(json.loads(json.dumps(target)))
            elif kind == "set":
                target["row"][column] = value
            else:
                target["row"][column] = f"\x00{value}"

    _forge(path, mutate, sign=True)
    try:
        report = archive.restore([path], batch=1)
    except archive.ArchiveError:
        assert _rows() == dict.fromkeys(_rows(), 0)
        return
    rows = _rows()
    assert rows["geneva_drive_workflows"] == report.workflows
    assert rows["geneva_drive_step_executions"] == report.step_executions
    assert rows["geneva_drive_signals"] == report.signals
