"""Workflows per (class, state), kept as rows instead of counted from the history (docs/MANUAL.md, "The dashboard").

The overview and ``/metrics`` show how many workflows of each class are in each state. Counting
``geneva_drive_workflows`` costs what the history kept costs (2 s at 1M workflows on
PostgreSQL); ``geneva_drive_workflow_counts`` holds the same numbers and grows with
the number of (class, state) pairs only.

Every write of a workflow row goes through one of three places, and each tells this module
what it changed:

* :func:`geneva_drive.persistence.flush` and :func:`~geneva_drive.persistence.insert_new`, the
  Core writes of the executor, the scheduler and ``Workflow.create`` (the state columns
  themselves come from :mod:`geneva_drive.transitions`, the one state writer);
* the ORM's own flush (operator actions, tests, host code): the ``before_flush`` listener below
  reads the old state from the attribute history;
* bulk deletes by Core (housekeeping's cleanup, the archive): :func:`forget_workflows` before
  the ``DELETE``.

The changes are collected per session and added to the counts when the transaction commits
(``before_commit``), after its last flush: a transaction takes its count-row locks last and
holds them only for its commit, so counting adds no lock-order cycle to the engine's (workflow,
then execution) order. A savepoint that rolls back drops its own changes, as its rows go
(the same bookkeeping as the message queue in :mod:`geneva_drive.transport`).

A step moves its workflow ``ready`` → ``performing`` when claimed and back when finalized; the
table keeps both under one row, ``ongoing`` (:data:`ONGOING`), so those two transitions change
no count and cost no statement (counting them cost 2 upserts per step, one per transaction,
the budget). :func:`read` splits ``ongoing`` again: ``performing`` is counted from the
workflows through ``(state, id)``, which costs what the workflows being performed right now
cost (a few per worker), and ``ready`` is the rest.

Sharding: a transaction adds its changes to one of :data:`SHARDS` rows per (class, state),
picked at random, so two workers moving workflows of one class from ``ready`` to
``performing`` rarely queue on the same row lock. A (class, state) count is the sum of its
shards; a single shard may be negative.
"""

from __future__ import annotations

import random
from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    bindparam,
    event,
    func,
    literal,
    select,
    union_all,
)
from sqlalchemy.orm import InstanceState, Session
from sqlalchemy.orm.base import NO_VALUE

from geneva_drive import sqla_internals
from geneva_drive.at_commit import AtCommit
from geneva_drive.compiled import Compiled
from geneva_drive.dialects import Dialect, dialect_for
from geneva_drive.errors import UsageError
from geneva_drive.models import Base

#: Rows per (class, state). A transaction writes one of them; more shards, fewer lock waits
#: between concurrent transitions, more rows to sum when reading (a few hundred in all).
SHARDS = 8

WORKFLOWS_TABLE = "geneva_drive_workflows"
_COUNTS = Base.metadata.tables["geneva_drive_workflow_counts"]
#: The state a new workflow row gets when none was set (the column's default).
_NEW_STATE = "ready"
#: The row ``ready`` and ``performing`` share: a step's claim and finalize move a workflow
#: between them, and should cost no count statement.
ONGOING = "ongoing"
_PERFORMING = "performing"
_FOLDED = {"ready": ONGOING, "performing": ONGOING}


def bucket(state: str) -> str:
    """The counts row a workflow in ``state`` is kept under."""
    return _FOLDED.get(state, state)


#: One recorded change: (class, state, +n / -n).
Change = tuple[str, str, int]


def _workflows() -> Any:
    # geneva_drive.workflow defines the table, and imports this module (through persistence).
    return Base.metadata.tables[WORKFLOWS_TABLE]


def record(session: Session, workflow_type: str, old: str | None, new: str | None) -> None:
    """A workflow row of ``workflow_type`` went from ``old`` to ``new`` in this transaction
    (``old`` None: inserted; ``new`` None: deleted)."""
    old = None if old is None else bucket(old)
    new = None if new is None else bucket(new)
    if old == new:
        return
    if old is not None:
        _pending.add(session, (workflow_type, old, -1))
    if new is not None:
        _pending.add(session, (workflow_type, new, 1))


def record_row_write(session: Session, state: InstanceState[Any], new: str) -> None:
    """persistence.flush wrote state ``new`` to the loaded workflow row ``state``."""
    old = state.committed_state.get("state", NO_VALUE)
    if old is NO_VALUE:  # never loaded: the transitions read it first, so this is not theirs
        raise UsageError(
            f"workflow #{state.identity} changed state without its old state loaded; "
            "the per-state counts cannot follow it"
        )
    record(session, state.dict["type"], old, new)


def forget_workflows(session: Session, ids: list[int]) -> None:
    """The workflows ``ids`` (locked by the caller) are about to be deleted by Core."""
    if not ids:
        return
    w = _workflows()
    rows = session.execute(
        select(w.c.type, w.c.state, func.count())
        .where(w.c.id.in_(ids))
        .group_by(w.c.type, w.c.state)
    ).all()
    _pending.extend(
        session, ((workflow_type, bucket(state), -int(n)) for workflow_type, state, n in rows)
    )


def pending_changes(session: Session) -> dict[tuple[str, str], int]:
    """The net change per (class, state) this session will add at its commit (zeros left out)."""
    return _totals(_pending.items(session))


def _totals(changes: list[Change]) -> dict[tuple[str, str], int]:
    totals: dict[tuple[str, str], int] = {}
    for workflow_type, state, n in changes:
        key = (workflow_type, state)
        totals[key] = totals.get(key, 0) + n
    return {key: n for key, n in totals.items() if n}


def read_statement() -> CompoundSelect[str, str, int]:
    """What :func:`read` runs: the kept rows per (class, state), and per class the workflows
    being performed (bench/engine_metrics.py explains its plan)."""
    w = _workflows()
    kept = select(_COUNTS.c.type, _COUNTS.c.state, func.sum(_COUNTS.c.count).label("n")).group_by(
        _COUNTS.c.type, _COUNTS.c.state
    )
    performing = (
        select(w.c.type, literal(_PERFORMING, _COUNTS.c.state.type), func.count())
        .where(w.c.state == _PERFORMING)
        .group_by(w.c.type)
    )
    return union_all(kept, performing)


def read(session: Session) -> dict[tuple[str, str], int]:
    """Workflows per (class, state), every pair with at least one workflow (one round trip:
    the kept rows, and the workflows being performed right now to split ``ongoing``)."""
    stored: dict[tuple[str, str], int] = {}
    split: dict[str, int] = {}
    for workflow_type, state, n in session.execute(read_statement()).all():
        if state == _PERFORMING:
            split[workflow_type] = int(n)
        elif n:
            stored[(workflow_type, state)] = int(n)
    result: dict[tuple[str, str], int] = {}
    for (workflow_type, state), n in stored.items():
        if state != ONGOING:
            result[(workflow_type, state)] = n
            continue
        # The two reads are not one snapshot everywhere: a workflow claimed in between is
        # counted as performing and still as ongoing, so ready never goes below zero here.
        busy = min(split.get(workflow_type, 0), n)
        for name, value in (("ready", n - busy), (_PERFORMING, busy)):
            if value:
                result[(workflow_type, name)] = value
    return result


def rebuild(session: Session) -> None:
    """Recount from the workflows table (one scan): after a restore, or to repair counts
    written while an engine without this module wrote workflows. Locks the counts table's rows
    it replaces; the caller commits."""
    session.execute(_COUNTS.delete())
    w = _workflows()
    rows = session.execute(
        select(w.c.type, w.c.state, func.count()).group_by(w.c.type, w.c.state)
    ).all()
    totals: dict[tuple[str, str], int] = {}
    for t, s, n in rows:
        totals[(t, bucket(s))] = totals.get((t, bucket(s)), 0) + int(n)
    if totals:
        session.execute(
            _COUNTS.insert(),
            [{"type": t, "state": s, "shard": 0, "count": n} for (t, s), n in totals.items()],
        )


def add_to_counts(connection: Connection, shard: int, changes: dict[tuple[str, str], int]) -> None:
    """Add ``changes`` to the counts' rows of ``shard``, creating the rows that do not exist.

    Rows go in (class, state) order, so two transactions writing the same shard lock its rows
    in the same order. The statement is prebuilt per backend and row count (the executor
    commits one or two changes per transaction; compiling an upsert each time cost more than
    a whole step, B10).
    """
    params: dict[str, Any] = {}
    for index, ((workflow_type, state), n) in enumerate(sorted(changes.items())):
        params[f"t{index}"], params[f"s{index}"] = workflow_type, state
        params[f"h{index}"], params[f"n{index}"] = shard, n
    dialect = dialect_for(connection)
    key = (dialect, len(changes))
    statement = _upserts.get(key)
    if statement is None:
        statement = _upserts[key] = Compiled(upsert_counts(dialect, len(changes)))
    statement.execute(connection, params)


_upserts: dict[tuple[Dialect, int], Compiled] = {}


def upsert_counts(dialect: Dialect, rows: int) -> Any:
    """``INSERT … count = count + new`` of ``rows`` rows, bound as ``t<i>``, ``s<i>``,
    ``h<i>`` (shard), ``n<i>``; each backend's form from its dialect (``upsert_adding``)."""
    c = _COUNTS.c
    values = [
        {
            "type": bindparam(f"t{i}", type_=c.type.type),
            "state": bindparam(f"s{i}", type_=c.state.type),
            "shard": bindparam(f"h{i}", type_=c.shard.type),
            "count": bindparam(f"n{i}", type_=c.count.type),
        }
        for i in range(rows)
    ]
    return dialect.upsert_adding(_COUNTS, values, (c.type, c.state, c.shard), "count")


# --- the session's bookkeeping -----------------------------------------------------------------


def _is_workflow(state: InstanceState[Any]) -> bool:
    return getattr(state.mapper.local_table, "name", None) == WORKFLOWS_TABLE


@event.listens_for(Session, "before_flush")
def _orm_flush(session: Session, _context: Any, _instances: Any) -> None:
    """The ORM's flush writes workflows the Core paths did not: count what it will change."""
    for obj in session.new:
        state: InstanceState[Any] = sqla_internals.state_of(obj)
        if _is_workflow(state):
            record(session, obj.type, None, obj.state or _NEW_STATE)
    for obj in session.deleted:
        state = sqla_internals.state_of(obj)
        if _is_workflow(state):
            loaded = state.committed_state.get("state", NO_VALUE)
            record(session, obj.type, obj.state if loaded is NO_VALUE else loaded, None)
    for obj in session.dirty:
        state = sqla_internals.state_of(obj)
        if _is_workflow(state) and "state" in state.committed_state:
            record_row_write(session, state, obj.state)


def _add_at_commit(session: Session, changes: list[Change]) -> None:
    totals = _totals(changes)
    if totals:
        add_to_counts(session.connection(), random.randrange(SHARDS), totals)


#: The changes a transaction adds to the counts when it commits: last of its writes
#: (:mod:`geneva_drive.at_commit`).
_pending: AtCommit[Change] = AtCommit("geneva_count_changes", write=_add_at_commit, order=100)


__all__ = [
    "ONGOING",
    "SHARDS",
    "add_to_counts",
    "bucket",
    "forget_workflows",
    "pending_changes",
    "read",
    "rebuild",
    "record",
    "record_row_write",
    "upsert_counts",
]
