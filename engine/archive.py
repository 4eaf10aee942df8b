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

**Signed files.** With ``GENEVA_ARCHIVE_KEY`` set (a secret of at least 32 characters that the
operator keeps, like a database password), the trailer also carries ``"hmac"``: an HMAC-SHA256,
under that key, of the header line and the trailer's counts and digest. The SHA-256 alone proves
a file whole, not genuine (anyone who edits a file can recompute it); the HMAC proves it was
written by a process holding the key. :func:`restore` refuses an unsigned file unless told
``trust_unsigned`` (``--trust-unsigned``), and a signed one whose HMAC does not match.

**What restore checks, before it inserts anything of a file.** The signature; every line's length
and the file's inflated size (a small file that inflates to gigabytes is refused, not read); every
row's columns, types and lengths against the schema; only finished or canceled workflows, only
executions that are over, only executions and signals of the file's own workflows, no id twice;
and every execution or signal id that already exists in the database for another workflow. A
file that fails any check is refused whole with one line saying where and why.

**Where files are written.** The directory must not be writable by other users (one who could
write there could plant a ``.partial`` symbolic link, and the archive would write elsewhere and
then delete the rows). Files are created exclusively (``O_EXCL | O_NOFOLLOW``), mode 0600; the
file read back and verified is the one this process wrote (the same inode), and it is the one
that takes the final name, before any row is deleted.

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
import hmac
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    String,
    Table,
    bindparam,
    delete,
    func,
    select,
    text,
    true,
    tuple_,
    update,
)
from sqlalchemy.orm import Session

from geneva_drive import counts, db
from geneva_drive.config import process_variable
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import ArchiveError, ConfigurationError, InvalidInputError
from geneva_drive.models import (
    TERMINAL_WORKFLOW_PREDICATE,
    Base,
    JSONType,
    UTCDateTime,
    utcnow,
)
from geneva_drive.states import FINAL_STEP_STATES, TERMINAL_WORKFLOW_STATES, SignalState

log = logging.getLogger("geneva_drive.archive")

FORMAT = "geneva-drive-archive"
VERSION = 1
WORKFLOWS = "geneva_drive_workflows"
EXECUTIONS = "geneva_drive_step_executions"
SIGNALS = "geneva_drive_signals"
#: The tables of an archive, in the order their rows are restored (a workflow before its rows).
TABLES = (WORKFLOWS, EXECUTIONS, SIGNALS)

SessionScope = Callable[[], AbstractContextManager[Session]]

#: The setting that holds the signing key.
KEY_SETTING = "GENEVA_ARCHIVE_KEY"
MIN_KEY_LENGTH = 32
#: The longest line a reader accepts: far above any row the engine writes (cursors and signal
#: payloads are capped at 128 KiB by default), far below what would exhaust memory.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: A file may inflate to at most this many times its compressed size (plus MAX_LINE_BYTES): the
#: engine's JSON compresses about ten times; a gzip bomb compresses a thousand times and more.
MAX_INFLATION = 100
#: A workflow type as the engine writes it: a class name, maybe dotted (it becomes a metrics label).
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,254}")
_SIGNAL_STATES = frozenset(state.value for state in SignalState)


def archive_key(required: bool = False) -> bytes | None:
    """The signing key from ``GENEVA_ARCHIVE_KEY``; None when unset (and not ``required``).

    A key shorter than :data:`MIN_KEY_LENGTH` is refused, naming the setting: a short key can be
    guessed, and a file it signs proves nothing.
    """
    raw = process_variable(KEY_SETTING)
    if not raw:
        if required:
            raise ConfigurationError(
                f"{KEY_SETTING} is not set: the archive files are signed, and restoring needs the "
                "key that signed them. Set it to the secret your archive job uses (or pass "
                "--trust-unsigned for files you know were written without one)."
            )
        return None
    if len(raw) < MIN_KEY_LENGTH:
        raise ConfigurationError(
            f"{KEY_SETTING} is {len(raw)} characters long; use a secret of at least "
            f"{MIN_KEY_LENGTH} (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return raw.encode()


def _signature(key: bytes, header: bytes, trailer: dict[str, Any]) -> str:
    """The HMAC of a file: its header line, then its trailer's counts and digest."""
    core = {name: trailer[name] for name in ("workflows", "step_executions", "signals", "sha256")}
    return hmac.new(key, header + _line(core), hashlib.sha256).hexdigest()


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
    """A table's archived rows back to the values the engine wrote, checked against the table:
    no unknown column, every column without a default present, each value of its column's type
    and length; ISO strings of its timestamp columns become datetimes."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.columns = {c.key: c for c in table.c}
        self.datetimes = tuple(c.key for c in table.c if isinstance(c.type, UTCDateTime))
        self.required = frozenset(
            c.key
            for c in table.c
            if not c.nullable and c.default is None and c.server_default is None
        )

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        unknown = row.keys() - self.columns.keys()
        if unknown:
            raise ArchiveError(
                f"{self.table.name} has no column {min(unknown)!r} (an archive of another version)"
            )
        missing = self.required - row.keys()
        if missing:
            raise ArchiveError(f"{self.table.name} row without {min(missing)!r}")
        for key, value in row.items():
            _check_value(self.columns[key], value)
        for key in self.datetimes:
            value = row.get(key)
            if value is not None:
                row[key] = datetime.fromisoformat(value)
        return row


#: The largest id or count a BIGINT column holds.
_BIGINT = 2**63 - 1


def _check_value(column: Column[Any], value: Any) -> None:
    """Refuse a value its column could not hold, before anything is inserted."""
    name = f"{column.table.name}.{column.key}"
    if value is None:
        if not column.nullable:
            raise ArchiveError(f"{name} is empty, and the column is required")
        return
    kind = column.type
    if isinstance(kind, UTCDateTime):
        if not isinstance(value, str) or len(value) > 40:
            raise ArchiveError(f"{name}: {value!r:.60} is not a timestamp")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ArchiveError(f"{name}: {value!r:.60} is not a timestamp") from None
        if parsed.tzinfo is None:
            raise ArchiveError(f"{name}: {value!r:.60} has no UTC offset")
    elif isinstance(kind, JSONType):
        return  # any JSON value (the line parsed)
    elif isinstance(kind, Boolean):
        if not isinstance(value, bool):
            raise ArchiveError(f"{name}: {value!r:.60} is not true or false")
    elif isinstance(kind, Integer):
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) > _BIGINT:
            raise ArchiveError(f"{name}: {value!r:.60} is not a whole number")
    elif isinstance(kind, String):
        if not isinstance(value, str):
            raise ArchiveError(f"{name}: {value!r:.60} is not text")
        if kind.length is not None and len(value) > kind.length:
            raise ArchiveError(f"{name} is {len(value)} characters, longer than {kind.length}")
        if "\x00" in value:
            raise ArchiveError(f"{name} holds a NUL character")


# --- writing -----------------------------------------------------------------------------------


class _DayFile:
    """One day's file while it is written: counts and a digest of the record lines."""

    def __init__(self, directory: Path, day: date, key: bytes | None) -> None:
        self.day = day
        self.key = key
        self.path, fd = _create(directory, day)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self._raw: IO[bytes] = os.fdopen(fd, "w+b")
        # Level 6 (zlib's default) rather than gzip's 9: about twice as fast, a few percent larger.
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0, compresslevel=6)
        self.digest = hashlib.sha256()
        self.counts = dict.fromkeys(TABLES, 0)
        #: workflow id -> (executions, signals) written: checked again before the delete.
        self.sizes: dict[int, tuple[int, int]] = {}
        self.header = _line({"format": FORMAT, "version": VERSION, "day": day.isoformat()})
        self._gzip.write(self.header)

    def write(self, table: str, row: dict[str, Any]) -> None:
        line = _line({"table": table, "row": row})
        self.digest.update(line)
        self.counts[table] += 1
        self._gzip.write(line)

    def trailer(self) -> dict[str, Any]:
        trailer: dict[str, Any] = {
            "end": True,
            "workflows": self.counts[WORKFLOWS],
            "step_executions": self.counts[EXECUTIONS],
            "signals": self.counts[SIGNALS],
            "sha256": self.digest.hexdigest(),
        }
        if self.key is not None:
            trailer["hmac"] = _signature(self.key, self.header, trailer)
        return trailer

    def finish(self) -> Path:
        """Close, sync, read back and check the file this process wrote (through its own
        descriptor, not its name); then give it its final name and check the name is it."""
        trailer = self.trailer()
        self._gzip.write(_line(trailer))
        self._gzip.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.seek(0)
        found = _verify_stream(self._raw, self.partial, self.key, os.fstat(self._raw.fileno()))
        if found != trailer:
            raise ArchiveError(
                f"{self.partial}: read back {found}, wrote {trailer}; nothing was deleted"
            )
        written = os.fstat(self._raw.fileno())
        os.replace(self.partial, self.path)
        _sync_directory(self.path.parent)
        named = os.lstat(self.path)
        self._raw.close()
        if (named.st_dev, named.st_ino) != (written.st_dev, written.st_ino):
            raise ArchiveError(
                f"{self.path} is not the file that was written and verified (replaced in the "
                "directory meanwhile?); nothing was deleted"
            )
        return self.path

    def abandon(self) -> None:
        self._gzip.close()
        self._raw.close()
        self.partial.unlink(missing_ok=True)


def _check_directory(directory: Path) -> None:
    """Refuse a directory other users may write to: one of them could plant a link there."""
    mode = os.stat(directory).st_mode
    if mode & stat.S_IWOTH:
        raise ArchiveError(
            f"{directory} is writable by other users (mode {stat.filemode(mode)}): one of them "
            "could plant a link there and have the archive written elsewhere. Make it private "
            f"(chmod 700 {directory}) or archive to another directory; nothing was written."
        )


def _create(directory: Path, day: date) -> tuple[Path, int]:
    """A free final name of ``day`` and its ``.partial`` file, created exclusively (never
    through a link, never over an existing file), mode 0600."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    number = 1
    while True:
        suffix = "" if number == 1 else f"-{number}"
        path = directory / f"geneva-drive-{day.isoformat()}{suffix}.jsonl.gz"
        number += 1
        if os.path.lexists(path):
            continue
        try:
            fd = os.open(path.with_name(path.name + ".partial"), flags, 0o600)
        except FileExistsError:
            continue  # a partial file (or a link) of that name: leave it, take the next
        return path, fd


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


def _lines(stream: gzip.GzipFile, name: Path, compressed: int) -> Iterator[bytes]:
    """The lines of an inflated archive, each at most MAX_LINE_BYTES, the whole at most
    MAX_INFLATION times the compressed size: a file crafted to inflate without end (a "gzip
    bomb") is refused after reading no more than that, never held in memory."""
    budget = compressed * MAX_INFLATION + MAX_LINE_BYTES
    total = 0
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES:
            raise ArchiveError(
                f"{name}: a line longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB; not an archive "
                "this engine wrote"
            )
        total += len(line)
        if total > budget:
            raise ArchiveError(
                f"{name} inflates to more than {MAX_INFLATION} times its size; not an archive "
                "this engine wrote (refused before reading it whole)"
            )
        yield line


def verify(path: Path, *, key: bytes | None = None, trust_unsigned: bool = True) -> dict[str, Any]:
    """Read ``path`` whole: its trailer, checked against the records it holds.

    Raises :class:`ArchiveError` for a file that is not an archive, is truncated, whose records
    do not match its trailer, or (given ``key``) whose signature does not match. An unsigned
    file passes only with ``trust_unsigned``. The record lines are counted by table and hashed,
    not parsed: the digest matching the trailer's shows they are the lines that were written
    (and a restore parses and checks each before it loads anything).
    """
    try:
        with open(path, "rb") as raw:
            return _verify_stream(raw, path, key, os.fstat(raw.fileno()), trust_unsigned)
    except OSError as error:
        raise ArchiveError(f"{path} cannot be read: {error}") from error


def _verify_stream(
    raw: IO[bytes],
    path: Path,
    key: bytes | None,
    info: os.stat_result,
    trust_unsigned: bool = True,
) -> dict[str, Any]:
    digest = hashlib.sha256()
    found = dict.fromkeys(TABLES, 0)
    trailer: dict[str, Any] | None = None
    endings = tuple(_LINE_ENDINGS.items())
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            lines = _lines(stream, path, info.st_size)
            header_line = next(lines, b"null")
            header = json.loads(header_line)
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ArchiveError(f"{path} is not a GenevaDrive archive")
            for line in lines:
                if trailer is not None:
                    raise ArchiveError(f"{path}: records after the trailer")
                if line.startswith(b'{"end":'):
                    trailer = json.loads(line)
                    if not isinstance(trailer, dict):
                        raise ArchiveError(f"{path}: its trailer is not an object")
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
    computed: dict[str, Any] = {
        "end": True,
        "workflows": found[WORKFLOWS],
        "step_executions": found[EXECUTIONS],
        "signals": found[SIGNALS],
        "sha256": digest.hexdigest(),
    }
    signature = trailer.get("hmac")
    unsigned = {k: v for k, v in trailer.items() if k != "hmac"}
    if computed != unsigned:
        raise ArchiveError(
            f"{path}: its records ({computed}) do not match its trailer ({unsigned})"
        )
    if signature is None:
        if not trust_unsigned:
            raise ArchiveError(
                f"{path} is not signed: anyone could have written it. Restore it only if you "
                "know where it came from, with --trust-unsigned"
            )
        return computed
    if key is None:
        if not trust_unsigned:
            raise ArchiveError(
                f"{path} is signed, but {KEY_SETTING} is not set: set it to the key that signed "
                "the archive"
            )
        return {**computed, "hmac": signature}
    expected = _signature(key, header_line, computed)
    if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
        raise ArchiveError(
            f"{path}: its signature does not match {KEY_SETTING}: the file was altered, or "
            "signed with another key; nothing of it was restored"
        )
    return {**computed, "hmac": signature}


def records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, decoded row) of every record of an archive file, in file order; each row checked
    against its table's schema (:class:`_Decoder`)."""
    for _number, table, row in _numbered_records(path):
        yield table, row


def _numbered_records(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    decoders = {name: _Decoder(table) for name, table in _tables().items()}
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            lines = _lines(stream, path, size)
            next(lines, None)
            for number, line in enumerate(lines, start=2):
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise ArchiveError(f"{path}, line {number}: not JSON ({error})") from None
                if not isinstance(record, dict):
                    raise ArchiveError(f"{path}, line {number}: not a record")
                if record.get("end"):
                    return
                table = record.get("table")
                row = record.get("row")
                if table not in decoders or not isinstance(row, dict):
                    raise ArchiveError(f"{path}, line {number}: not a row of a known table")
                try:
                    yield number, table, decoders[table](row)
                except ArchiveError as error:
                    raise ArchiveError(f"{path}, line {number}: {error}") from None


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
    key = archive_key()
    if key is None:
        log.warning(
            "archive: %s is not set, so the files are not signed; a restore will need "
            '--trust-unsigned (docs/MANUAL.md, "Retention and archives")',
            KEY_SETTING,
        )
    to.mkdir(parents=True, exist_ok=True, mode=0o700)
    _check_directory(to)
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
                        current = _DayFile(to, day, key)
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
    paths: Sequence[Path],
    *,
    batch: int = 500,
    session_scope: SessionScope | None = None,
    trust_unsigned: bool = False,
) -> RestoreReport:
    """Load archive files into the database (see the module docstring).

    Every file is verified (its signature under ``GENEVA_ARCHIVE_KEY``; an unsigned one only
    with ``trust_unsigned``) and every row of it checked before anything of it is inserted; a
    file that fails is refused whole with :class:`ArchiveError`, and the files before it stay
    restored. Workflows already in the database are skipped with their rows, so a restore that
    stopped may be run again.
    """
    scope = session_scope or _default_scope()
    key = archive_key(required=not trust_unsigned)
    for path in paths:
        # Every file checked before any row goes in.
        verify(path, key=key, trust_unsigned=trust_unsigned)
    report = RestoreReport()
    #: (child id, parent id, updated_at) of every restored workflow that had a parent: set last.
    links: list[tuple[int, int, datetime]] = []
    for path in paths:
        _check_rows(scope, path)
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


#: Ids looked up in the database per query while a file is checked.
_CHECK_BATCH = 1000


def _check_rows(scope: SessionScope, path: Path) -> set[int]:
    """Read ``path`` once and check every row before anything of it is inserted: only finished
    or canceled workflows with a plausible type, only executions that are over, executions and
    signals of the file's own workflows only, no id twice, and no execution or signal id that
    the database holds for another workflow. Returns the ids of the file's workflows already in
    the database (skipped, with their rows)."""
    workflows: set[int] = set()
    owners: dict[str, dict[int, int]] = {EXECUTIONS: {}, SIGNALS: {}}
    for number, table, row in _numbered_records(path):
        where = f"{path}, line {number}"
        if table == WORKFLOWS:
            if row["id"] in workflows:
                raise ArchiveError(f"{where}: workflow {row['id']} appears twice")
            if row["state"] not in TERMINAL_WORKFLOW_STATES:
                raise ArchiveError(
                    f"{where}: workflow {row['id']} is {row['state']!r}; an archive holds only "
                    "finished or canceled workflows"
                )
            if not isinstance(row["type"], str) or not _TYPE_NAME.fullmatch(row["type"]):
                raise ArchiveError(f"{where}: {row['type']!r:.60} is not a workflow class name")
            workflows.add(row["id"])
            continue
        owner = row["workflow_id"]
        if owner not in workflows:
            raise ArchiveError(
                f"{where}: a {table} row of workflow {owner}, which is not (before it) in this "
                "file; an archive holds the rows of its own workflows only"
            )
        if row["id"] in owners[table]:
            raise ArchiveError(f"{where}: {table} id {row['id']} appears twice")
        if table == EXECUTIONS and row["state"] not in FINAL_STEP_STATES:
            raise ArchiveError(
                f"{where}: execution {row['id']} is {row['state']!r}; an archived execution is over"
            )
        if table == SIGNALS and row["state"] not in _SIGNAL_STATES:
            raise ArchiveError(f"{where}: signal {row['id']} has no known state")
        owners[table][row["id"]] = owner
    tables = _tables()
    with scope() as session:
        present: set[int] = set()
        ids = sorted(workflows)
        w = tables[WORKFLOWS]
        for start in range(0, len(ids), _CHECK_BATCH):
            chunk = ids[start : start + _CHECK_BATCH]
            present.update(session.scalars(select(w.c.id).where(w.c.id.in_(chunk))))
        for name in (EXECUTIONS, SIGNALS):
            rows = tables[name]
            wanted = sorted(i for i, owner in owners[name].items() if owner not in present)
            for start in range(0, len(wanted), _CHECK_BATCH):
                chunk = wanted[start : start + _CHECK_BATCH]
                taken = session.execute(
                    select(rows.c.id, rows.c.workflow_id).where(rows.c.id.in_(chunk))
                ).first()
                if taken is not None:
                    raise ArchiveError(
                        f"{path}: {name} id {taken[0]} already exists in the database (for "
                        f"workflow {taken[1]}); nothing of this file was restored. Restore it "
                        "into a database without those rows."
                    )
        session.rollback()
    return present


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
        raise InvalidInputError(
            f"{value!r} is not an age: write it as 30d, 12h, 90m, 45s or a number of seconds"
        ) from None
    if seconds <= 0:
        raise InvalidInputError(f"{value!r}: the age must be more than 0")
    return timedelta(seconds=seconds)


__all__ = [
    "ArchiveError",
    "ArchiveReport",
    "RestoreReport",
    "archive",
    "archive_key",
    "parse_age",
    "records",
    "restore",
    "verify",
]
