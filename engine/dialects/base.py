"""What the engine asks of a database: the one interface every backend module implements.

The engine and the dashboard never test a database's name. They ask the dialect object of
their session or engine (:func:`geneva_drive.dialects.dialect_for`) what it can do
(``row_locks``, ``partial_indexes``, ``combined_flush``) and let it build the statements that
differ (``lock``, ``id_in``, ``epoch_seconds``, ``write_updates``). One module per backend
implements it; adding a database is adding one (CONTRIBUTING.md, "Adding a database").

The defaults here are those of a server database with row locks (PostgreSQL's behaviour, for
which the engine's lock sections were designed); each backend module overrides what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NamedTuple, TypeVarTuple

from sqlalchemy import (
    Boolean,
    Column,
    ColumnElement,
    Connection,
    DateTime,
    Engine,
    Table,
    Text,
    Update,
    insert,
)
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

_Ts = TypeVarTuple("_Ts")


class Write(NamedTuple):
    """One row's UPDATE in a flush: ``params`` binds ``pk`` and ``v_<column>`` per name.
    (A tuple: a flush builds one per written row, on every step.)"""

    table: Table
    names: tuple[str, ...]
    params: dict[str, Any]


@dataclass(frozen=True)
class Sweep:
    """The scheduler's stray sweep, to be written in the same statement as a flush's writes.

    ``statement(prefix, exclude)`` is :func:`geneva_drive.persistence.stray_sweep`;
    ``columns(now)`` the columns it sets (:func:`geneva_drive.transitions.swept_columns`):
    passed in, since the dialects sit below the state writer in the layers.
    """

    workflow_id: int
    now: datetime
    executions: Table
    stray_states: frozenset[str]
    statement: Callable[[str, tuple[str, ...]], Update]
    columns: Callable[[Any], dict[str, Any]]

    def excluded(self, writes: Sequence[Write]) -> tuple[str, ...]:
        """The bind names of the written executions' ids (one statement never changes a row
        twice, so the sweep leaves them alone)."""
        return tuple(
            f"p{index}_pk"
            for index, write in enumerate(writes)
            if write.table.name == self.executions.name
        )


def combined_params(writes: Sequence[Write], sweep: Sweep | None) -> dict[str, Any]:
    """Every write's parameters prefixed ``p<index>_``, and the sweep's as ``s_…``."""
    combined: dict[str, Any] = {}
    for index, write in enumerate(writes):
        combined.update({f"p{index}_{key}": value for key, value in write.params.items()})
    if sweep is not None:
        combined["s_workflow_id"], combined["s_now"] = sweep.workflow_id, sweep.now
    return combined


class Dialect:
    """One database backend, as the engine uses it. Stateless: one instance per backend."""

    #: The backend's family name, for messages and metrics labels (not for branching).
    name: ClassVar[str]
    #: SQLAlchemy's dialect names this backend serves (``mysql`` and ``mariadb`` for one).
    sqlalchemy_names: ClassVar[tuple[str, ...]]

    # --- capabilities ---------------------------------------------------------------------
    #: ``SELECT … FOR UPDATE [SKIP LOCKED]`` exists. Without it a lock section holds the
    #: database write lock from :meth:`begin_write` on, and a plain read suffices.
    row_locks: ClassVar[bool] = True
    #: ``CREATE INDEX … WHERE``; without, the models' MYSQL_FORMS (generated columns) stand in.
    partial_indexes: ClassVar[bool] = True
    #: A flush's UPDATEs and the scheduler's stray sweep go out as one statement
    #: (:meth:`write_updates`); without, the scheduler sweeps first and flushes after.
    combined_flush: ClassVar[bool] = True
    #: A flush's writes, the sweep and one INSERT after them go out as one statement
    #: (:meth:`write_updates_and_insert`).
    combined_insert: ClassVar[bool] = False
    #: A transaction may give up waiting for its own commit's durable flush
    #: (:meth:`relax_durability`); the executor then commits a step's start that way.
    asynchronous_commit: ClassVar[bool] = False
    #: UTC datetimes are stored without a zone (the column type has none).
    naive_datetimes: ClassVar[bool] = False
    #: How the test plugin isolates a test's database: ``"file"`` (a copied SQLite file),
    #: ``"schema"`` (a schema per test) or ``"database"`` (a database per test).
    test_isolation: ClassVar[str] = "database"

    # --- connections and sessions -----------------------------------------------------------
    #: Pooled connections can die unseen (a server restarted): the engine's idle liveness
    #: check (``db.install_idle_ping``) tests them at checkout.
    idle_ping: ClassVar[bool] = True

    def session_options(self, url: str, options: dict[str, Any] | None) -> dict[str, Any]:
        """``create_engine`` options with this backend's session settings added (what
        ``url`` or ``options`` set wins). The dashboard passes its own through here too."""
        return dict(options or {})

    def engine_options(self, url: str, options: dict[str, Any]) -> dict[str, Any]:
        """The engine's own ``create_engine`` options (:func:`geneva_drive.db.make_engine`):
        the session settings, and whatever the URL's target needs (a directory, say)."""
        return self.session_options(url, options)

    def install(self, engine: Engine) -> None:
        """After ``create_engine``: this backend's per-connection settings (pragmas)."""

    def adopt(self, engine: Engine) -> None:
        """An engine made elsewhere (the dashboard's) gets the engine's per-connection
        settings; connections it opened without them are dropped."""

    def begin_write(self, session: Session) -> None:
        """Make sure the session may write before a lock section (no-op with row locks)."""

    def relax_durability(self, session: Session) -> None:
        """This transaction's commit need not wait for its durable flush, where the
        database allows that per transaction (a lost commit only leaves work to redo)."""

    def tune_for_aggregates(self, session: Session) -> None:
        """Session settings for the metrics' large grouped reads (this transaction only)."""

    # --- locks ------------------------------------------------------------------------------
    def lock(
        self, query: Select[*_Ts], *, skip_locked: bool = False, of: Any | None = None
    ) -> Select[*_Ts]:
        """``query`` as a locking read (``FOR UPDATE``), or unchanged without row locks."""
        if not self.row_locks:
            return query
        return query.with_for_update(skip_locked=skip_locked, of=of)

    def refresh_locked(self, session: Session, obj: Any) -> None:
        """Reload ``obj``'s row under its row lock."""
        if self.row_locks:
            session.refresh(obj, with_for_update=True)
        else:
            session.refresh(obj)

    def lock_or_create(self, connection: Connection, table: Table, key: str, value: Any) -> None:
        """Create ``table``'s row whose primary key ``key`` is ``value`` if it is missing, and
        hold that row's lock until the transaction ends, in one statement (the limit slots of
        engine/limits.py: the lock every claim of a slot takes)."""
        raise NotImplementedError

    def lock_candidates_first(self) -> bool:
        """Whether a locking scan must be split into a plain read of candidates, then a
        lock of those by primary key (InnoDB locks every row a scan reads)."""
        return False

    def primary_key_only(self, query: Select[*_Ts], table: Table) -> Select[*_Ts]:
        """``query`` made to read ``table`` through its primary key (an index hint)."""
        return self.through_index(query, table, "PRIMARY")

    def through_index(self, query: Select[*_Ts], table: Table, index: str) -> Select[*_Ts]:
        """``query`` made to read ``table`` through ``index`` where the backend's planner may
        not pick it (an index hint); elsewhere ``query`` as it is."""
        return query

    # --- types --------------------------------------------------------------------------------
    def datetime_impl(self, dialect: SQLAlchemyDialect) -> Any:
        """The column type behind the models' UTC datetime."""
        return dialect.type_descriptor(DateTime(timezone=True))

    def json_impl(self, dialect: SQLAlchemyDialect) -> Any:
        """The column type behind the models' JSON columns."""
        return dialect.type_descriptor(Text())

    def json_native(self, dialect: SQLAlchemyDialect) -> bool:
        """The driver encodes and decodes JSON itself (else the models do, as text)."""
        return False

    # --- schema -------------------------------------------------------------------------------
    def before_create(self, connection: Connection, tables: Iterable[Table]) -> None:
        """``create_all``: table options this server needs (its collation, say)."""

    def ddl_applies(self, dialect: SQLAlchemyDialect, allowed: str | Sequence[str]) -> bool:
        """Whether an ``Index.ddl_if(dialect=allowed)`` is created on this database."""
        name = dialect.name
        return name == allowed if isinstance(allowed, str) else name in allowed

    # --- queries ------------------------------------------------------------------------------
    def id_in(self, column: Column[int], ids: list[int]) -> ColumnElement[bool]:
        """``column IN ids`` for a long list of ids."""
        return column.in_(ids)

    def without_index(self, column: Any) -> Any:
        """``column`` as a term the planner should not use an index for (SQLite's planner,
        without statistics, needs telling)."""
        return column

    def off_index_predicate(self, predicate: str) -> str:
        """A literal SQL predicate kept off every index, as :meth:`without_index`."""
        return predicate

    def epoch_seconds(self, column: Any) -> Any:
        """Whole seconds since 1970-01-01 UTC of a datetime column."""
        raise NotImplementedError

    # --- writing --------------------------------------------------------------------------------
    def write_updates(
        self,
        connection: Connection,
        writes: Sequence[Write],
        *,
        asynchronous_commit: bool,
        sweep: Sweep | None,
    ) -> bool:
        """Write a flush's UPDATEs (and the sweep) in one round trip where the backend can.

        Returns True if every write is done; False if the caller must still run each write
        as its own UPDATE (the sweep, if any, is then done already).
        """
        return False

    def write_updates_and_insert(
        self,
        connection: Connection,
        writes: Sequence[Write],
        sweep: Sweep,
        insert: Write,
    ) -> int | None:
        """A flush's UPDATEs, the sweep, then one ``INSERT`` (``insert.params`` binds
        ``v_<column>`` per name; its ``pk`` is unused) in one round trip where the backend can:
        the new row's id. None: the backend cannot, and nothing was written (the caller
        writes them one after another). The INSERT must see the UPDATEs and the sweep done:
        the new row may only be valid once they are (the one-active-execution index)."""
        return None

    def upsert_adding(
        self, table: Table, values: list[dict[str, Any]], keys: Sequence[Column[Any]], column: str
    ) -> Any:
        """``INSERT`` of ``values``; where a row with the same ``keys`` exists, its ``column``
        is increased by the new row's value instead (the per-state counts)."""
        raise NotImplementedError(f"{self.name}: no adding upsert")

    def insert_unless_duplicate(self, table: Table) -> Any:
        """An ``INSERT`` into ``table`` that inserts nothing where the row would repeat a unique
        key (its rowcount is 0 then, 1 otherwise): a dedup read and an INSERT in one round
        trip (a child's end, reported once)."""
        raise NotImplementedError(f"{self.name}: no insert-unless-duplicate")

    def bulk_insert(self, session: Session, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` (every column of ``table``, Python values) in ``session``'s
        transaction, as fast as the backend takes many rows (an archive restored)."""
        session.execute(insert(table), list(rows))

    def advance_id_sequences(self, session: Session, tables: Iterable[str]) -> None:
        """After rows were inserted with explicit ids (an archive restored): make the next new
        row of each table get a larger id. A no-op where the counter follows explicit ids."""


__all__ = ["Dialect", "Sweep", "Write", "combined_params"]


# --- constructs whose rendering differs per database ------------------------------------------


class SubqueryFirst(ColumnElement[bool]):
    """``column IN (subquery)`` that PostgreSQL evaluates subquery first, whatever it estimates.

    PostgreSQL renders it ``column = ANY(ARRAY(subquery))``: the subquery runs once (an
    InitPlan, through its executions index) and the workflows are then fetched by primary key.
    As a plain IN or a join, with an ``ORDER BY id LIMIT`` or a misestimated history, the
    planner may instead walk the workflows (the primary key backwards for ``?due=stuck``: 157k
    buffers at 5M; a hash join over every finished workflow for the doctor's
    terminal-with-live-execution rule: 1.7 s at 200k). Other backends get the IN.
    """

    type = Boolean()
    inherit_cache = False  # holds a subquery of its own: not cached
    _is_implicitly_boolean = True  # a predicate: no "= 1" appended where booleans are ints

    def __init__(self, column: Any, subquery: Select[Any]) -> None:
        self.column = column
        self.subquery = subquery


@compiles(SubqueryFirst)
def _subquery_first_default(element: SubqueryFirst, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.column.in_(element.subquery), **kw))


@compiles(SubqueryFirst, "postgresql")
def _subquery_first_postgresql(element: SubqueryFirst, compiler: Any, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    subquery = compiler.process(element.subquery.scalar_subquery(), **kw)
    return f"{column} = ANY(ARRAY{subquery})"
