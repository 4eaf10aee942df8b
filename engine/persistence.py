"""Writing the engine's own rows with Core statements, the ORM objects kept in sync.

The executor and the scheduler change a loaded workflow and its executions through the ORM
objects (the state machine, user hooks and conditions all see and may change them). Letting the
ORM unit of work write those changes costs more than everything else a step does: for each
flush it sorts the session's states by mapper dependency, diffs every attribute's history and
builds the statements anew - about half of a step's CPU time (bench/RESULTS.md, B1).

Here the same changes are written with one prebuilt Core ``UPDATE`` (or ``INSERT``) per row,
binding exactly the columns whose attributes changed - on PostgreSQL a flush's UPDATEs travel
as one statement of data-modifying CTEs, on MariaDB/MySQL as one multi-table UPDATE, one round
trip either way (``Dialect.write_updates``, engine/dialects/) - and the objects are then marked clean
as a flush would leave them (a rollback expunges or expires them as after a flush). What the
fast path does not cover - a changed relationship, a pending delete, any other kind of
object - falls back to ``Session.flush()``, so the contract of the unit of work (every change
made to a loaded object is written) holds either way.

Reading works the same way: :func:`load` turns a Core row (the executor's lock row) into the
persistent object an ORM query would have returned, at a third of the query's cost.

The bookkeeping calls SQLAlchemy's own loader and flush use are private API, called through
:mod:`geneva_drive.sqla_internals` only: tests/engine/test_persistence.py pins each contract, so
an SQLAlchemy upgrade that changes one fails there first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Insert,
    Table,
    Update,
    bindparam,
    event,
    insert,
    inspect,
    literal_column,
    update,
)
from sqlalchemy.orm import (
    ColumnProperty,
    InstanceState,
    Mapper,
    Session,
)
from sqlalchemy.orm.base import NO_VALUE

from geneva_drive import counts, sqla_internals, transitions
from geneva_drive.compiled import Compiled
from geneva_drive.dialects import Dialect, Sweep, Write, dialect_for
from geneva_drive.errors import InvalidInputError
from geneva_drive.models import Base, StepExecution, utcnow
from geneva_drive.states import STRAY_STEP_STATES

# The tables written here: workflows (every Workflow subclass shares the one table) and step
# executions. Named, not imported: geneva_drive.workflow imports the scheduler, which imports this.
_FAST_TABLES = frozenset({"geneva_drive_workflows", "geneva_drive_step_executions"})

# (table, columns) -> the prebuilt UPDATE; columns are the changed ones in a stable order.
_updates: dict[tuple[str, tuple[str, ...]], Compiled] = {}
# (table, columns, RETURNING id) -> the prebuilt INSERT.
_inserts: dict[tuple[str, tuple[str, ...], bool], Compiled] = {}
_EXECUTIONS = Base.metadata.tables["geneva_drive_step_executions"]
# mapper -> attribute key -> its single column (None for anything else: relationships, ...)
_columns: dict[Mapper[Any], dict[str, Column[Any] | None]] = {}


def _column_map(mapper: Mapper[Any]) -> dict[str, Column[Any] | None]:
    found = _columns.get(mapper)
    if found is None:
        found = {}
        for prop in mapper.iterate_properties:
            column: Column[Any] | None = None
            if isinstance(prop, ColumnProperty) and len(prop.columns) == 1:
                candidate = prop.columns[0]
                if isinstance(candidate, Column) and candidate.table is mapper.persist_selectable:
                    column = candidate
            found[prop.key] = column
        _columns[mapper] = found
    return found


def _bound_values(table: Table, names: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """``column = :<prefix>v_<column>`` for each name, typed as the column."""
    return {name: bindparam(f"{prefix}v_{name}", type_=table.c[name].type) for name in names}


def _update_statement(table: Table, names: tuple[str, ...]) -> Compiled:
    key = (table.name, names)
    statement = _updates.get(key)
    if statement is None:
        statement = _updates[key] = Compiled(
            update(table).where(table.c.id == bindparam("pk")).values(_bound_values(table, names))
        )
    return statement


def _insert_statement(table: Table, names: tuple[str, ...], returning: bool) -> Compiled:
    """The INSERT of these columns; with ``RETURNING id`` where the database has it (else
    the driver's ``lastrowid`` gives the id)."""
    key = (table.name, names, returning)
    statement = _inserts.get(key)
    if statement is None:
        built: Insert = insert(table).values(_bound_values(table, names))
        if returning:
            built = built.returning(table.c.id)
        statement = _inserts[key] = Compiled(built)
    return statement


def _changed_columns(state: InstanceState[Any]) -> dict[str, Any] | None:
    """Column name -> new value for every changed attribute; None if one is not a column.

    An attribute set back to the value it was loaded with is no change, as for the unit of
    work (which then writes no UPDATE at all).
    """
    columns = _column_map(state.mapper)
    changed: dict[str, Any] = {}
    dict_ = state.dict
    for key, original in state.committed_state.items():
        column = columns.get(key)
        if column is None or key not in dict_:
            return None
        value = dict_[key]
        if original is not NO_VALUE and value == original:
            continue
        changed[column.name] = value
    return changed


def flush(
    session: Session,
    *,
    asynchronous_commit: bool = False,
    sweep: tuple[int, datetime] | None = None,
) -> bool:
    """Write the session's pending changes, workflows and executions by Core UPDATE.

    Anything else that is pending (new or deleted objects, other classes, relationship
    changes) is left to ``Session.flush()`` afterwards, which then finds the fast-written
    objects clean.

    Where the database can (``Dialect.write_updates``), the UPDATEs go out as one statement,
    one round trip instead of one per row: on PostgreSQL data-modifying CTEs, whose
    ``asynchronous_commit`` adds ``set_config('synchronous_commit', 'off', true)`` (the
    transaction's commit then does not wait for its WAL flush); on MariaDB/MySQL one
    multi-table UPDATE.

    ``sweep`` (workflow id, time): cancel that workflow's stray executions (the scheduler's
    sweep, engine/scheduling.py) in the same statement - only where that is the same as
    sweeping first: where the dialect has ``combined_flush``, with changes to write, none of
    them to an execution that is or was loaded as stray (the sweep also excludes the written
    rows by id: one statement never changes a row twice). Returns True if it swept; False,
    having written nothing, if the caller must sweep first and flush afterwards.
    """
    if _DEFERRED in session.info:
        write_deferred(session)
    writes, rest = _pending_writes(session)
    connection = session.connection() if writes or asynchronous_commit or sweep else None
    dialect = dialect_for(connection) if connection is not None else None
    if sweep is not None and not _can_sweep(dialect, writes):
        return False
    if not writes and not asynchronous_commit:
        if rest:
            session.flush()
        return False
    assert connection is not None and dialect is not None
    _write_rows(connection, dialect, writes, asynchronous_commit, sweep)
    _written(session, writes)
    if rest:
        session.flush()
    return sweep is not None


def _written(session: Session, writes: list[tuple[InstanceState[Any], Write]]) -> None:
    """The objects just written are clean, as a flush leaves them."""
    identity_map = session.identity_map
    for state, row in writes:
        if "v_state" in row.params and row.table.name == counts.WORKFLOWS_TABLE:
            counts.record_row_write(session, state, row.params["v_state"])
        sqla_internals.mark_clean(state, identity_map)
        # As a flush does: a rollback (of a savepoint too) expires what this transaction wrote.
        sqla_internals.expire_on_rollback(session, [state])


def _pending_writes(session: Session) -> tuple[list[tuple[InstanceState[Any], Write]], bool]:
    """The UPDATE of each changed workflow and execution, and whether anything else is
    pending (left to ``Session.flush()``). Objects whose changes cancel out are marked clean."""
    identity_map = session.identity_map
    rest = bool(session.new) or bool(session.deleted)
    writes: list[tuple[InstanceState[Any], Write]] = []
    for obj in list(session.dirty):
        state: InstanceState[Any] = inspect(obj)
        table = state.mapper.persist_selectable
        if not isinstance(table, Table) or table.name not in _FAST_TABLES:
            rest = True
            continue
        if not state.has_identity or not state.committed_state:
            rest = rest or state.modified
            continue
        changed = _changed_columns(state)
        if changed is None:
            rest = True
            continue
        if not changed:
            sqla_internals.mark_clean(state, identity_map)
            continue
        if "updated_at" not in changed:
            now = utcnow()
            changed["updated_at"] = now
            state.dict["updated_at"] = now
        names = tuple(sorted(changed))
        params = {f"v_{name}": changed[name] for name in names}
        params["pk"] = state.identity[0] if state.identity else None
        writes.append((state, Write(table, names, params)))
    return writes, rest


def _can_sweep(dialect: Dialect | None, writes: list[tuple[InstanceState[Any], Write]]) -> bool:
    """Whether the sweep can go out with these writes (see :func:`flush`)."""
    if dialect is None or not dialect.combined_flush or not writes:
        return False
    return not any(_stray(state) for state, _row in writes)


def _write_rows(
    connection: Connection,
    dialect: Dialect,
    writes: list[tuple[InstanceState[Any], Write]],
    asynchronous_commit: bool,
    sweep: tuple[int, datetime] | None,
) -> None:
    """The writes in one statement where the dialect can, else one UPDATE per row."""
    rows = [write for _state, write in writes]
    stray = _sweep(sweep) if sweep is not None else None
    if dialect.write_updates(
        connection, rows, asynchronous_commit=asynchronous_commit, sweep=stray
    ):
        return
    for write in rows:
        _update_statement(write.table, write.names).execute(connection, write.params)


def _sweep(sweep: tuple[int, datetime]) -> Sweep:
    return Sweep(
        workflow_id=sweep[0],
        now=sweep[1],
        executions=_EXECUTIONS,
        stray_states=frozenset(STRAY_STEP_STATES),
        statement=stray_sweep,
        columns=transitions.swept_columns,
    )


def sweep_strays(
    session: Session, workflow_id: int, now: datetime, *, with_pending: bool = False
) -> None:
    """Cancel the workflow's stray executions (:func:`stray_sweep`). ``with_pending``: the
    session's pending writes go with it, in the same statement where :func:`flush` can,
    else after the sweep."""
    if with_pending and flush(session, sweep=(workflow_id, now)):
        return
    _STRAY_SWEEP.execute(session.connection(), {"workflow_id": workflow_id, "now": now})


def _stray(state: InstanceState[Any]) -> bool:
    """An execution whose state is stray now or was when loaded."""
    if state.mapper.persist_selectable is not _EXECUTIONS:
        return False
    loaded = state.committed_state.get("state", NO_VALUE)
    return state.dict.get("state") in STRAY_STEP_STATES or loaded in STRAY_STEP_STATES


def stray_sweep(prefix: str = "", exclude: tuple[str, ...] = ()) -> Update:
    """Cancel every scheduled or waiting execution of a workflow (the "stray" sweep).

    Binds ``<prefix>workflow_id`` and ``<prefix>now``; ``exclude`` names bind parameters of
    execution ids left alone. The states are SQL literals, so the statement is built once.
    """
    table = _EXECUTIONS
    stray: list[ColumnElement[str]] = [
        literal_column(f"'{state}'") for state in sorted(STRAY_STEP_STATES)
    ]
    now = bindparam(f"{prefix}now", type_=table.c.updated_at.type)
    conditions = [
        table.c.workflow_id == bindparam(f"{prefix}workflow_id"),
        table.c.state.in_(stray),
    ]
    conditions.extend(table.c.id != bindparam(name) for name in exclude)
    return update(table).where(*conditions).values(**transitions.swept_columns(now))


_STRAY_SWEEP = Compiled(stray_sweep())


def insert_new(
    session: Session,
    obj: Any,
    *,
    sweep: tuple[int, datetime] | None = None,
    deferred_id: int | None = None,
) -> None:
    """INSERT a new workflow or execution by Core; it joins the session persistent and clean.

    Pending changes are written first: the new row may only be valid once they are (an
    execution may only be inserted once the previous one has left its active state, the
    one-active index). Columns left ``None`` get their Python default, else NULL, as the
    unit of work does (a JSON column would otherwise store the JSON literal null).

    ``sweep`` (workflow id, time): that workflow's stray executions are canceled first too
    (:func:`sweep_strays`). Where the dialect can (``Dialect.write_updates_and_insert``,
    PostgreSQL), the pending writes, the sweep and the INSERT go out as one statement: a
    step's outcome and its successor's row in one round trip.

    ``deferred_id`` (an execution with a ``sweep``, its id drawn from the sequence already):
    nothing is written now. The object joins the session persistent under that id, and its
    row goes out at the next write of this session (:func:`write_deferred`: the next flush,
    INSERT or commit), with whatever its attributes say then, in the same statement as the
    pending writes and the sweep where the dialect can. The executor starts an inline
    successor in between, so its row is inserted started.
    """
    state: InstanceState[Any] = inspect(obj)
    table = state.mapper.persist_selectable
    if state.key is not None or state.session_id is not None:
        raise InvalidInputError(f"persistence.insert_new() takes a new object, not {obj!r}")
    if not isinstance(table, Table) or table.name not in _FAST_TABLES:
        raise InvalidInputError(
            f"persistence.insert_new() writes workflows and executions, not {obj!r}"
        )
    if deferred_id is not None and (table is not _EXECUTIONS or sweep is None):
        raise InvalidInputError(
            "persistence.insert_new(deferred_id=) defers an execution with a sweep"
        )
    columns = _column_map(state.mapper)
    dict_ = state.dict
    row: dict[str, Any] = {}
    now = utcnow()  # created_at and updated_at of a new row are the same instant
    for key, column in columns.items():
        if column is None or column.primary_key:
            continue
        value = dict_.get(key)
        if value is None and column.name in ("created_at", "updated_at"):
            value = now
        elif value is None and column.default is not None:
            default = column.default
            if default.is_callable:
                value = default.arg(None)  # type: ignore[attr-defined]
            elif default.is_scalar:
                value = default.arg  # type: ignore[attr-defined]
        dict_[key] = value
        if value is not None:
            row[column.name] = value
    if deferred_id is not None:
        assert sweep is not None
        write_deferred(session)  # one at a time: an earlier one goes out first
        dict_["id"] = deferred_id
    else:
        names = tuple(sorted(row))
        dict_["id"] = _insert_after_pending(
            session, Write(table, names, {f"v_{name}": row[name] for name in names}), sweep
        )
    # Every column attribute is set (None where the row has NULL), so the object never has
    # to refresh itself. It then becomes persistent the way a flush makes an inserted object
    # persistent: registered as new in this transaction, so a rollback expunges it again.
    session.add(obj)
    sqla_internals.register_inserted(session, {state})
    if deferred_id is not None:
        assert sweep is not None
        # The object itself, not its state: the identity map holds a clean object weakly.
        session.info[_DEFERRED] = (obj, sweep)
    if table.name == counts.WORKFLOWS_TABLE:
        counts.record(session, dict_["type"], None, dict_["state"])


# session.info key: the (execution, sweep) whose INSERT waits for the next write.
_DEFERRED = "geneva_deferred_insert"


def write_deferred(session: Session, *, flushing: bool = False) -> None:
    """INSERT the execution :func:`insert_new` deferred, if any, with its attributes as they
    are now: the pending writes and the sweep first, in one statement with the INSERT where
    the dialect can (one round trip for a step's outcome and its started successor).

    ``flushing``: called by the unit of work's own flush, which writes what else is pending
    (new objects, other classes) after this; the engine's rows go out here by Core."""
    deferred: tuple[Any, tuple[int, datetime]] | None = session.info.pop(_DEFERRED, None)
    if deferred is None:
        return
    obj, sweep = deferred
    state: InstanceState[Any] = inspect(obj)
    columns = _column_map(state.mapper)
    dict_ = state.dict
    row = {
        column.name: dict_[key]
        for key, column in columns.items()
        if column is not None and dict_.get(key) is not None
    }
    names = tuple(sorted(row))
    insert = Write(_EXECUTIONS, names, {f"v_{name}": row[name] for name in names})
    # Its values are in the INSERT: the object is clean, so no UPDATE is built for it.
    sqla_internals.mark_clean(state, session.identity_map, dict_)
    _insert_after_pending(session, insert, sweep, flushing=flushing)


@event.listens_for(Session, "before_flush")
def _deferred_before_flush(session: Session, _context: Any, _instances: Any) -> None:
    # The unit of work may write rows that must follow it (or read it back): it goes first.
    if _DEFERRED in session.info:
        write_deferred(session, flushing=True)


@event.listens_for(Session, "before_commit")
def _deferred_before_commit(session: Session) -> None:
    # A commit with nothing else to flush never runs before_flush.
    if _DEFERRED in session.info:
        write_deferred(session)


@event.listens_for(Session, "after_rollback")
def _deferred_rolled_back(session: Session) -> None:
    # The object is expunged with the transaction that registered it; its row never existed.
    session.info.pop(_DEFERRED, None)


def _insert_after_pending(
    session: Session,
    insert: Write,
    sweep: tuple[int, datetime] | None,
    *,
    flushing: bool = False,
) -> int:
    """The pending writes (and the sweep), then ``insert``: the new row's id.

    ``flushing``: inside the unit of work's flush, which writes what else is pending after
    this; the engine's rows go out by Core, and ``Session.flush()`` is not called again."""
    if _DEFERRED in session.info:
        write_deferred(session, flushing=flushing)
    if sweep is not None:
        connection = session.connection()
        dialect = dialect_for(connection)
        writes, rest = _pending_writes(session) if dialect.combined_insert else ([], True)
        if (flushing or not rest) and _can_sweep(dialect, writes):
            new_id = dialect.write_updates_and_insert(
                connection, [write for _state, write in writes], _sweep(sweep), insert
            )
            if new_id is not None:
                _written(session, writes)
                return new_id
    if flushing:
        _flush_by_core(session, sweep)
    else:
        if sweep is not None:
            sweep_strays(session, *sweep, with_pending=True)
        flush(session)
    connection = session.connection()
    statement = _insert_statement(insert.table, insert.names, connection.dialect.insert_returning)
    return statement.lastrowid(connection, insert.params)


def _flush_by_core(session: Session, sweep: tuple[int, datetime] | None) -> None:
    """The pending writes of workflows and executions (and the sweep, first or with them),
    by Core only: what else is pending is left to the flush under way."""
    connection = session.connection()
    dialect = dialect_for(connection)
    writes, _rest = _pending_writes(session)
    swept = sweep is not None and dialect.combined_flush and _can_sweep(dialect, writes)
    if sweep is not None and not swept:
        _STRAY_SWEEP.execute(connection, {"workflow_id": sweep[0], "now": sweep[1]})
    if writes:
        _write_rows(connection, dialect, writes, False, sweep if swept else None)
    _written(session, writes)


def insert_execution(
    session: Session,
    *,
    sweep: tuple[int, datetime] | None = None,
    deferred_id: int | None = None,
    **values: Any,
) -> StepExecution:
    """INSERT one step execution (see :func:`insert_new`) from column attribute values."""
    mapper: Mapper[Any] = inspect(StepExecution)
    columns = _column_map(mapper)
    unknown = [key for key in values if columns.get(key) is None]
    if unknown:
        raise InvalidInputError(f"StepExecution has no column attribute {unknown[0]!r}")
    # Built as the ORM builds a loaded row (no __init__, no attribute events per column).
    execution: StepExecution = mapper.class_manager.new_instance()
    inspect(execution).dict.update(values)
    insert_new(session, execution, sweep=sweep, deferred_id=deferred_id)
    return execution


def load(session: Session, cls: type[Any], values: dict[str, Any]) -> Any:
    """The persistent object for a row read by Core, as a query with ``populate_existing``
    would give it: the class its polymorphic ``type`` names, clean, in the identity map.

    An object already in the session is refreshed from the row (pending changes must have
    been written first, as for :func:`refresh`). A new one is built and attached as
    SQLAlchemy's own row loader does (``orm/loading.py``: identity key, session id, identity
    map, committed state), so a rollback expires it and its relationships load lazily on
    access. At 2 objects per step this is a third of the ORM query's cost.
    """
    mapper: Mapper[Any] = inspect(cls)
    # An ORM query configures the mappers first; a fresh worker process may not have run one
    # yet, and an unconfigured class has no attribute instrumentation (nor do classes defined
    # since the last configuration). A no-op once configured.
    sqla_internals.configure(mapper)
    if mapper.polymorphic_on is not None:
        mapper = mapper.polymorphic_map[values[mapper.polymorphic_on.name]]
    identity = mapper.identity_key_from_primary_key(
        tuple(values[column.name] for column in mapper.primary_key)
    )
    identity_map = session.identity_map
    existing = identity_map.get(identity)
    if existing is not None:
        refresh(session, existing, values)
        return existing
    obj = mapper.class_manager.new_instance()
    state: InstanceState[Any] = inspect(obj)
    state.key = identity
    state.identity_token = identity[2]
    state.session_id = session.hash_key
    sqla_internals.add_to_identity_map(identity_map, state, identity)
    refresh(session, obj, values)  # the columns, then committed: clean, as after a load
    return obj


def values(obj: Any) -> dict[str, Any]:
    """A loaded object's columns by column name: the row :func:`load` turns back into it."""
    state: InstanceState[Any] = inspect(obj)
    dict_ = state.dict
    return {
        column.name: dict_[key] if key in dict_ else getattr(obj, key)
        for key, column in _column_map(state.mapper).items()
        if column is not None
    }


def refresh(session: Session, obj: Any, values: dict[str, Any]) -> None:
    """Overwrite a loaded object's columns with a row just read (``populate_existing``).

    ``values`` maps column names to the row's (type-processed) values. Pending changes must
    have been written first (:func:`flush`), as the ORM's autoflush does before a query.
    """
    state: InstanceState[Any] = inspect(obj)
    columns = _column_map(state.mapper)
    dict_ = state.dict
    for key, column in columns.items():
        if column is not None and column.name in values:
            dict_[key] = values[column.name]
    sqla_internals.mark_clean(state, session.identity_map, dict_)


__all__ = [
    "flush",
    "insert_execution",
    "insert_new",
    "load",
    "refresh",
    "sweep_strays",
    "values",
    "write_deferred",
]
