"""Retention that keeps what it deletes: finished workflows to gzip JSON Lines, then delete.

``geneva-drive archive --older-than 30d --to DIR`` (and housekeeping, when
``settings.archive_completed_workflows_to`` names a directory) writes every finished or canceled
workflow whose ``transitioned_at`` is older than the cutoff, with its step executions and its
signals, to one file per day of ``transitioned_at`` (UTC): ``geneva-drive-YYYY-MM-DD.jsonl.gz``
(``…-2.jsonl.gz`` and on when a file of that day exists already). A file is written under a
``.partial`` name, flushed to disk, then read back whole and checked - its record counts and a
SHA-256 of its record lines against what was written and against the file's own trailer -
before it takes its final name. Only then are its rows deleted, in transactions of
``batch`` workflows, each locked and checked again first: a workflow that is no longer
finished/canceled and old, or whose executions or signals changed in number since they were
written, is left in the database (the next run archives it again).

The format, one JSON object per line::

    {"format": "geneva-drive-archive", "version": 1, "day": "2026-01-01"}
    {"table": "geneva_drive_workflows", "row": {...every column...}}
    {"table": "geneva_drive_step_executions", "row": {...}}   (its executions, by id)
    {"table": "geneva_drive_signals", "row": {...}}           (its signals, by id)
    ...
    {"end": true, "workflows": 3, "step_executions": 21, "signals": 2, "sha256": "..."}

Timestamps are ISO 8601 strings with their UTC offset; JSON columns are nested JSON.

:func:`restore` loads such files into a database with the engine's tables (the same or a new
one): it checks each file's trailer first (a truncated or altered file is refused whole), then
inserts the rows with their ids, ``batch`` workflows per transaction; a workflow whose id is
already in the database is skipped with its rows, so a restore that stopped may be run again.
A child workflow's ``parent_id`` (a foreign key) goes in empty and is set once every file is
loaded, where its parent is in the database: files are ordered by ``transitioned_at``, and a
child usually ends before its parent (a parent canceled before its children ended comes first),
so neither order can be relied on. A skipped child whose ``parent_id`` is still empty gets it
too (a restore that stopped before this last step); a parent neither archived nor in the
database leaves it empty, as deleting the parent does (``ON DELETE SET NULL``).
The per-state counts (:mod:`geneva_drive.counts`) follow.

No Flask here: the CLI (``geneva_drive.dashboard.cli``) and housekeeping call it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Table, bindparam, delete, func, select, text, true, tuple_, update
from sqlalchemy.orm import Session

from geneva_drive import counts, db
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import EngineError
from geneva_drive.models import (
    TERMINAL_WORKFLOW_PREDICATE,
    Base,
    UTCDateTime,
    utcnow,
)

log = logging.getLogger("geneva_drive.archive")

FORMAT = "geneva-drive-archive"
VERSION = 1
WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
SIGNALS = "geneva_drive_signals"
#: The tables of an archive, in the order their rows are restored (a workflow before its rows).
TABLES = (WORKFLOWS, EXECUTIONS, SIGNALS)

SessionScope = Callable[[], AbstractContextManager[Session]]


class ArchiveError(EngineError):
    """An archive file could not be written, verified or restored; the message names it."""


@dataclass
class ArchiveReport:
    """What one :func:`archive` run wrote and deleted."""

    files: list[Path] = field(default_factory=list)
    workflows: int = 0
    step_executions: int = 0
    signals: int = 0
    #: Workflows written but left in the database (changed after they were written).
    kept: int = 0


@dataclass
class RestoreReport:
    workflows: int = 0
    step_executions: int = 0
    signals: int = 0
    #: Workflows whose id was already in the database (skipped with their rows).
    skipped: int = 0


def _tables() -> dict[str, Table]:
    return {name: Base.metadata.tables[name] for name in TABLES}


def _default_scope() -> SessionScope:
    @contextmanager
    def scope() -> Iterator[Session]:
        session = db.new_session()
        try:
            yield session
        finally:
            session.close()

    return scope


# --- encoding ----------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    """JSON for what ``json`` does not encode: datetimes as ISO 8601 with their offset."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


# One encoder for every line (``json.dumps`` with options builds one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=_default)


def _line(record: dict[str, Any]) -> bytes:
    return _ENCODER.encode(record).encode() + b"\n"


class _Decoder:
    """A table's archived rows back to the values the engine wrote: ISO strings of its
    timestamp columns to datetimes; a column the table does not have refused."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.columns = frozenset(table.c.keys())
        self.datetimes = tuple(c.key for c in table.c if isinstance(c.type, UTCDateTime))

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        unknown = row.keys() - self.columns
        if unknown:
            raise ArchiveError(
                f"{self.table.name} has no column {min(unknown)!r} (an archive of another version)"
            )
        for key in self.datetimes:
            value = row.get(key)
            if value is not None:
                row[key] = datetime.fromisoformat(value)
        return row


# --- writing -----------------------------------------------------------------------------------


class _DayFile:
    """One day's file while it is written: counts and a digest of the record lines."""

    def __init__(self, directory: Path, day: date) -> None:
        self.day = day
        self.path = _free_name(directory, day)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self._raw: IO[bytes] = open(self.partial, "wb")  # noqa: SIM115 - closed in finish()
        # Level 6 (zlib's default) rather than gzip's 9: about twice as fast, a few percent larger.
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0, compresslevel=6)
        self.digest = hashlib.sha256()
        self.counts = dict.fromkeys(TABLES, 0)
        #: workflow id -> (executions, signals) written: checked again before the delete.
        self.sizes: dict[int, tuple[int, int]] = {}
        self._gzip.write(_line({"format": FORMAT, "version": VERSION, "day": day.isoformat()}))

    def write(self, table: str, row: dict[str, Any]) -> None:
        line = _line({"table": table, "row": row})
        self.digest.update(line)
        self.counts[table] += 1
        self._gzip.write(line)

    def trailer(self) -> dict[str, Any]:
        return {
            "end": True,
            "workflows": self.counts[WORKFLOWS],
            "step_executions": self.counts[EXECUTIONS],
            "signals": self.counts[SIGNALS],
            "sha256": self.digest.hexdigest(),
        }

    def finish(self) -> Path:
        """Close, sync, read back and check; then give the file its final name."""
        trailer = self.trailer()
        self._gzip.write(_line(trailer))
        self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        found = verify(self.partial)
        if found != trailer:
            raise ArchiveError(
                f"{self.partial}: read back {found}, wrote {trailer}; nothing was deleted"
            )
        os.replace(self.partial, self.path)
        _sync_directory(self.path.parent)
        return self.path

    def abandon(self) -> None:
        self._gzip.close()
        self._raw.close()
        self.partial.unlink(missing_ok=True)


def _free_name(directory: Path, day: date) -> Path:
    path = directory / f"geneva-drive-{day.isoformat()}.jsonl.gz"
    number = 2
    while path.exists() or path.with_name(path.name + ".partial").exists():
        path = directory / f"geneva-drive-{day.isoformat()}-{number}.jsonl.gz"
        number += 1
    return path


def _sync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: How each record line ends: its keys are sorted, so the table's name comes last.
_LINE_ENDINGS = {f',"table":"{name}"}}\n'.encode(): name for name in TABLES}


def verify(path: Path) -> dict[str, Any]:
    """Read ``path`` whole: its trailer, checked against the records it holds.

    Raises :class:`ArchiveError` for a file that is not an archive, is truncated, or whose
    records do not match its trailer. The record lines are counted by table and hashed, not
    parsed: the digest matching the trailer's shows they are the lines that were written (and
    a restore parses each as it loads it).
    """
    digest = hashlib.sha256()
    found = dict.fromkeys(TABLES, 0)
    trailer: dict[str, Any] | None = None
    endings = tuple(_LINE_ENDINGS.items())
    try:
        with gzip.open(path, "rb") as stream:
            header = json.loads(stream.readline() or b"null")
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ArchiveError(f"{path} is not a GenevaDrive archive")
            for line in stream:
                if trailer is not None:
                    raise ArchiveError(f"{path}: records after the trailer")
                if line.startswith(b'{"end":'):
                    trailer = json.loads(line)
                    continue
                for ending, table in endings:
                    if line.endswith(ending):
                        found[table] += 1
                        break
                else:
                    raise ArchiveError(f"{path}: a record of no known table: {line[:80]!r}")
                digest.update(line)
    except (OSError, EOFError, ValueError) as error:
        raise ArchiveError(f"{path} cannot be read: {error}") from error
    if trailer is None:
        raise ArchiveError(f"{path} is truncated (no trailer); it was not written completely")
    computed = {
        "end": True,
        "workflows": found[WORKFLOWS],
        "step_executions": found[EXECUTIONS],
        "signals": found[SIGNALS],
        "sha256": digest.hexdigest(),
    }
    if computed != trailer:
        raise ArchiveError(f"{path}: its records ({computed}) do not match its trailer ({trailer})")
    return computed


def records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, decoded row) of every record of an archive file, in file order."""
    decoders = {name: _Decoder(table) for name, table in _tables().items()}
    with gzip.open(path, "rb") as stream:
        stream.readline()
        for line in stream:
            record = json.loads(line)
            if record.get("end"):
                return
            yield record["table"], decoders[record["table"]](record["row"])


def archive(
    older_than: timedelta,
    to: Path,
    *,
    now: datetime | None = None,
    batch: int = 500,
    session_scope: SessionScope | None = None,
) -> ArchiveReport:
    """Write finished/canceled workflows older than ``older_than`` to ``to``, verify, delete.

    See the module docstring. Returns what was written and deleted; raises
    :class:`ArchiveError` (with nothing of that day deleted) when a file fails its check.
    """
    scope = session_scope or _default_scope()
    cutoff = (now or utcnow()) - older_than
    to.mkdir(parents=True, exist_ok=True)
    report = ArchiveReport()
    current: _DayFile | None = None
    after: tuple[datetime, int] | None = None
    try:
        while True:
            with scope() as session:
                page = _candidates(session, cutoff, after, batch)
                if not page:
                    break
                after = (page[-1]["transitioned_at"], page[-1]["id"])
                for day, rows in _by_day(page):
                    if current is not None and current.day != day:
                        _finish_day(scope, current, cutoff, batch, report)
                        current = None
                    if current is None:
                        current = _DayFile(to, day)
                    _write_workflows(session, current, rows)
                session.rollback()
        if current is not None:
            _finish_day(scope, current, cutoff, batch, report)
            current = None
    finally:
        if current is not None:
            current.abandon()
    return report


def _candidates(
    session: Session, cutoff: datetime, after: tuple[datetime, int] | None, batch: int
) -> list[dict[str, Any]]:
    w = Base.metadata.tables[WORKFLOWS]
    past = true() if after is None else tuple_(w.c.transitioned_at, w.c.id) > tuple_(*after)
    query = (
        select(w)
        .where(text(TERMINAL_WORKFLOW_PREDICATE), w.c.transitioned_at < cutoff, past)
        .order_by(w.c.transitioned_at, w.c.id)
        .limit(batch)
    )
    return [dict(row._mapping) for row in session.execute(query)]


def _by_day(page: list[dict[str, Any]]) -> Iterator[tuple[date, list[dict[str, Any]]]]:
    rows: list[dict[str, Any]] = []
    day: date | None = None
    for row in page:
        at: datetime = row["transitioned_at"]
        if day is not None and at.date() != day:
            yield day, rows
            rows = []
        day = at.date()
        rows.append(row)
    if day is not None:
        yield day, rows


def _write_workflows(session: Session, out: _DayFile, workflows: list[dict[str, Any]]) -> None:
    tables = _tables()
    ids = [row["id"] for row in workflows]
    children: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for name in (EXECUTIONS, SIGNALS):
        table = tables[name]
        by_workflow: dict[int, list[dict[str, Any]]] = {}
        for found in session.execute(
            select(table).where(table.c.workflow_id.in_(ids)).order_by(table.c.id)
        ):
            by_workflow.setdefault(found.workflow_id, []).append(dict(found._mapping))
        children[name] = by_workflow
    for workflow in workflows:
        out.write(WORKFLOWS, workflow)
        executions = children[EXECUTIONS].get(workflow["id"], [])
        signals = children[SIGNALS].get(workflow["id"], [])
        for row in executions:
            out.write(EXECUTIONS, row)
        for row in signals:
            out.write(SIGNALS, row)
        out.sizes[workflow["id"]] = (len(executions), len(signals))


def _finish_day(
    scope: SessionScope, out: _DayFile, cutoff: datetime, batch: int, report: ArchiveReport
) -> None:
    try:
        path = out.finish()
    except BaseException:
        out.abandon()
        raise
    report.files.append(path)
    log.info("archive: wrote and verified %s (%s)", path, out.trailer())
    ids = sorted(out.sizes)
    for start in range(0, len(ids), batch):
        _delete_archived(scope, ids[start : start + batch], out.sizes, cutoff, report)


def _delete_archived(
    scope: SessionScope,
    ids: list[int],
    sizes: dict[int, tuple[int, int]],
    cutoff: datetime,
    report: ArchiveReport,
) -> None:
    """Delete the archived workflows ``ids`` that are as they were written, in one transaction."""
    tables = _tables()
    w, e, s = tables[WORKFLOWS], tables[EXECUTIONS], tables[SIGNALS]
    with scope() as session:
        db.begin_write(session)
        locked = select(w.c.id).where(
            w.c.id.in_(ids), text(TERMINAL_WORKFLOW_PREDICATE), w.c.transitioned_at < cutoff
        )
        dialect = dialect_for(session)
        # Locked through the primary key, as housekeeping's cleanup does: on InnoDB a locking
        # read through the (state, transitioned_at) index would also lock index entries a
        # writer changing a workflow's state must take (a deadlock, measured there).
        locked = dialect.primary_key_only(dialect.lock(locked), w)
        still = set(session.scalars(locked.order_by(w.c.id)))
        now_sizes: dict[int, list[int]] = {i: [0, 0] for i in still}
        for index, table in enumerate((e, s)):
            grouped = (
                select(table.c.workflow_id, func.count())
                .where(table.c.workflow_id.in_(still))
                .group_by(table.c.workflow_id)
            )
            for workflow_id, n in session.execute(grouped):
                now_sizes[workflow_id][index] = int(n)
        chosen = [i for i in sorted(still) if tuple(now_sizes[i]) == sizes[i]]
        report.kept += len(ids) - len(chosen)
        if chosen:
            counts.forget_workflows(session, chosen)
            report.step_executions += _deleted(
                session, delete(e).where(e.c.workflow_id.in_(chosen))
            )
            report.signals += _deleted(session, delete(s).where(s.c.workflow_id.in_(chosen)))
            report.workflows += _deleted(session, delete(w).where(w.c.id.in_(chosen)))
        session.commit()


def _deleted(session: Session, statement: Any) -> int:
    return int(session.execute(statement).rowcount)  # type: ignore[attr-defined]


# --- restoring ---------------------------------------------------------------------------------


def restore(
    paths: Sequence[Path], *, batch: int = 500, session_scope: SessionScope | None = None
) -> RestoreReport:
    """Load archive files into the database (see the module docstring)."""
    scope = session_scope or _default_scope()
    for path in paths:
        verify(path)  # every file checked before any row goes in
    report = RestoreReport()
    #: (child id, parent id, updated_at) of every restored workflow that had a parent: set last.
    links: list[tuple[int, int, datetime]] = []
    for path in paths:
        pending: list[tuple[str, dict[str, Any]]] = []
        workflows = 0
        for table, row in records(path):
            if table == WORKFLOWS:
                if workflows == batch:
                    _load(scope, pending, report)
                    pending, workflows = [], 0
                workflows += 1
                if row["parent_id"] is not None:
                    links.append((row["id"], row["parent_id"], row["updated_at"]))
                    row = {**row, "parent_id": None}
            pending.append((table, row))
        if pending:
            _load(scope, pending, report)
        log.info("archive: restored %s", path)
    for start in range(0, len(links), batch):
        _link_parents(scope, links[start : start + batch])
    with scope() as session:
        # Rows went in with their own ids: new rows must get larger ones (PostgreSQL's
        # sequences do not follow explicit ids; the other backends' counters do).
        dialect_for(session).advance_id_sequences(session, TABLES)
        session.commit()
    return report


def _load(
    scope: SessionScope, rows: list[tuple[str, dict[str, Any]]], report: RestoreReport
) -> None:
    tables = _tables()
    wanted = [row["id"] for table, row in rows if table == WORKFLOWS]
    with scope() as session:
        db.begin_write(session)
        w = tables[WORKFLOWS]
        present = set(session.scalars(select(w.c.id).where(w.c.id.in_(wanted))))
        report.skipped += len(present)
        by_table: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
        for table, row in rows:
            owner = row["id"] if table == WORKFLOWS else row["workflow_id"]
            if owner not in present:
                by_table[table].append(row)
        dialect = dialect_for(session)
        for name in TABLES:
            if by_table[name]:
                dialect.bulk_insert(session, tables[name], by_table[name])
        for row in by_table[WORKFLOWS]:
            counts.record(session, row["type"], None, row["state"])
        session.commit()
    report.workflows += len(by_table[WORKFLOWS])
    report.step_executions += len(by_table[EXECUTIONS])
    report.signals += len(by_table[SIGNALS])


def _link_parents(scope: SessionScope, links: list[tuple[int, int, datetime]]) -> None:
    """Set ``parent_id`` of the children in ``links`` whose parent is in the database.

    Only where it is still empty: a child that was in the database before the restore keeps
    the parent it has, and ``updated_at`` stays as archived (the column's ``onupdate`` would
    stamp the restore's time on it). The parents are looked up first rather than in the
    UPDATE's own subquery, which MySQL and MariaDB refuse on the table being updated.
    """
    w = _tables()[WORKFLOWS]
    with scope() as session:
        db.begin_write(session)
        parents = {parent for _child, parent, _at in links}
        present = set(session.scalars(select(w.c.id).where(w.c.id.in_(parents))))
        found = [{"child": c, "parent": p, "updated": at} for c, p, at in links if p in present]
        if found:
            session.execute(
                update(w)
                .where(w.c.id == bindparam("child"), w.c.parent_id.is_(None))
                .values(parent_id=bindparam("parent"), updated_at=bindparam("updated")),
                found,
            )
        session.commit()
    if len(found) < len(links):
        log.info(
            "archive: %d restored child workflows keep no parent (not archived, not present): %s",
            len(links) - len(found),
            sorted(c for c, p, _at in links if p not in present),
        )


def parse_age(value: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or a number of seconds; an error names the form."""
    raw = value.strip().lower()
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        unit = units.get(raw[-1:], 0)
        seconds = float(raw[:-1]) * unit if unit else float(raw)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an age: write it as 30d, 12h, 90m, 45s or a number of seconds"
        ) from None
    if seconds <= 0:
        raise ValueError(f"{value!r}: the age must be more than 0")
    return timedelta(seconds=seconds)


__all__ = [
    "ArchiveError",
    "ArchiveReport",
    "RestoreReport",
    "archive",
    "parse_age",
    "records",
    "restore",
    "verify",
]
