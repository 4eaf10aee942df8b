"""PostgreSQL: row locks with SKIP LOCKED, JSONB, ``timestamptz``, per-transaction
asynchronous commit, a flush's UPDATEs as one statement of data-modifying CTEs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Table,
    and_,
    any_,
    bindparam,
    cast,
    event,
    func,
    literal,
    select,
    text,
    true,
    update,
)
from sqlalchemy import insert as sql_insert
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.engine.interfaces import ExceptionContext
from sqlalchemy.orm import Session

from geneva_drive.compiled import Compiled
from geneva_drive.dialects.base import Dialect, Sweep, Write, combined_params

_Shapes = tuple[tuple[str, tuple[str, ...]], ...]


class PostgreSQLDialect(Dialect):
    name: ClassVar[str] = "postgresql"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("postgresql",)
    asynchronous_commit: ClassVar[bool] = True
    combined_insert: ClassVar[bool] = True
    test_isolation: ClassVar[str] = "schema"

    def lock_or_create(self, connection: Connection, table: Table, key: str, value: Any) -> None:
        # The row exists but for a slot's first claim: SELECT ... FOR UPDATE locks it without
        # writing a new row version per claim. A missing row is created by ON CONFLICT DO
        # UPDATE, which takes its lock whether this transaction or a concurrent one inserted it.
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        column = table.c[key]
        if connection.execute(select(column).where(column == value).with_for_update()).first():
            return
        statement = pg_insert(table).values({key: value})
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=[column], set_={key: statement.excluded[key]}
            )
        )

    def __init__(self) -> None:
        self._combined: dict[tuple[_Shapes, bool, bool], Compiled] = {}
        self._combined_inserts: dict[tuple[_Shapes, str, tuple[str, ...]], Compiled] = {}

    def install(self, engine: Engine) -> None:
        if not event.contains(engine, "handle_error", _socket_closed_is_a_disconnect):
            event.listen(engine, "handle_error", _socket_closed_is_a_disconnect)

    def adopt(self, engine: Engine) -> None:
        self.install(engine)

    def relax_durability(self, session: Session) -> None:
        session.execute(text("SET LOCAL synchronous_commit TO OFF"))

    def tune_for_aggregates(self, session: Session) -> None:
        # The planner overestimates the overdue rows (history is full of past scheduled_for
        # values), so the queries cross jit_above_cost and compiling them took 0.8 s of a
        # 1 s refresh at 1M workflows, for queries that then run in ~0.2 s (bench/B9_METRICS.md).
        session.execute(text("SET LOCAL jit = off"))

    def json_impl(self, dialect: SQLAlchemyDialect) -> Any:
        # None is SQL NULL, as on the other backends (their JSON is text, and None stays
        # None): JSONB's default writes a JSON ``null`` for a None it is handed, so an
        # archive's restore (a Core insert of every column) turned empty columns into ``null``.
        return dialect.type_descriptor(JSONB(none_as_null=True))

    def json_native(self, dialect: SQLAlchemyDialect) -> bool:
        return True

    def id_in(self, column: Column[int], ids: list[int]) -> ColumnElement[bool]:
        # One array parameter instead of an IN list of thousands: PostgreSQL parses and plans
        # such a list in time linear in its length, a third of each slice when measured.
        return column == any_(bindparam(None, ids, type_=ARRAY(BigInteger), unique=True))

    def epoch_seconds(self, column: Any) -> Any:
        return cast(func.floor(func.extract("epoch", column)), Integer)

    def upsert_adding(
        self, table: Table, values: list[dict[str, Any]], keys: Sequence[Column[Any]], column: str
    ) -> Any:
        statement = postgresql_insert(table).values(values)
        return statement.on_conflict_do_update(
            index_elements=list(keys),
            set_={column: table.c[column] + statement.excluded[column]},
        )

    def insert_unless_duplicate(self, table: Table) -> Any:
        return postgresql_insert(table).on_conflict_do_nothing()

    def bulk_insert(self, session: Session, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """``COPY … FROM STDIN``: half the time of an executemany INSERT for a restore's rows
        (measured: 22,500 rows, 1.7 s against 3.5 s). Values go through the same adapters as
        an INSERT's, JSON columns wrapped as JSONB (None stays SQL NULL)."""
        connection = session.connection()
        if connection.dialect.driver != "psycopg":
            # Another driver (psycopg2, pg8000) has another COPY interface: the plain INSERT.
            super().bulk_insert(session, table, rows)
            return
        from psycopg.types.json import Jsonb

        columns = list(table.c.keys())
        # The models' JSON columns are JSONB here (json_impl above); looked up through the
        # type's implementation for this dialect, as the dialects do not import the models.
        json_columns = {
            key
            for key in columns
            if isinstance(
                getattr(table.c[key].type.dialect_impl(connection.dialect), "impl", None), JSONB
            )
        }
        names = ", ".join(f'"{table.c[key].name}"' for key in columns)
        driver = connection.connection.driver_connection
        assert driver is not None  # a checked-out connection has its driver's
        with (
            driver.cursor() as cursor,
            cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy,
        ):
            for row in rows:
                copy.write_row(
                    tuple(
                        Jsonb(value) if key in json_columns and value is not None else value
                        for key in columns
                        for value in (row.get(key),)
                    )
                )

    def advance_id_sequences(self, session: Session, tables: Iterable[str]) -> None:
        # Explicit ids leave the serial's sequence behind: the next insert would collide.
        for name in tables:
            session.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                    f"COALESCE((SELECT MAX(id) FROM {name}), 0) + 1, false)"
                )
            )

    def write_updates(
        self,
        connection: Connection,
        writes: Sequence[Write],
        *,
        asynchronous_commit: bool,
        sweep: Sweep | None,
    ) -> bool:
        """The UPDATEs as one statement (data-modifying CTEs), one round trip instead of one
        per row; ``asynchronous_commit`` adds ``set_config('synchronous_commit', 'off',
        true)`` to it (the transaction's commit then does not wait for its WAL flush)."""
        if len(writes) <= 1 and not asynchronous_commit and sweep is None:
            return False
        shapes = tuple((write.table.name, write.names) for write in writes)
        statement = self._combined_statement(shapes, writes, asynchronous_commit, sweep)
        statement.execute(connection, combined_params(writes, sweep))
        return True

    def write_updates_and_insert(
        self,
        connection: Connection,
        writes: Sequence[Write],
        sweep: Sweep,
        insert: Write,
    ) -> int | None:
        """``WITH u0 AS (UPDATE …), …, sweep AS (UPDATE …) INSERT … SELECT … WHERE …``: the
        successor's row with its predecessor's outcome, one round trip fewer per step (issue
        33). PostgreSQL runs data-modifying CTEs in no set order with the main statement, so
        the INSERT's one row is produced only after a one-time filter has counted every CTE's
        rows: each has then run to completion. The rows they changed are this transaction's,
        so the unique one-active index sees the predecessor's old version as deleted, exactly
        as after a separate UPDATE."""
        key = (
            tuple((write.table.name, write.names) for write in writes),
            insert.table.name,
            insert.names,
        )
        statement = self._combined_inserts.get(key)
        if statement is None:
            ctes = self._write_ctes(writes)
            ctes.append(
                sweep.statement("s_", sweep.excluded(writes))
                .returning(sweep.executions.c.id)
                .cte("geneva_sweep")
            )
            table = insert.table
            guard = and_(
                *(select(func.count()).select_from(cte).scalar_subquery() >= 0 for cte in ctes)
            )
            source = select(
                *(
                    bindparam(f"i_v_{name}", type_=table.c[name].type).label(name)
                    for name in insert.names
                )
            ).where(guard)
            statement = self._combined_inserts[key] = Compiled(
                sql_insert(table)
                .from_select(list(insert.names), source)
                .returning(table.c.id)
                .add_cte(*ctes)
            )
        params = combined_params(writes, sweep)
        params.update({f"i_{name}": value for name, value in insert.params.items()})
        return statement.lastrowid(connection, params)

    def _write_ctes(self, writes: Sequence[Write]) -> list[Any]:
        """One ``UPDATE … RETURNING id`` CTE per write, binding ``p<index>_…``."""
        ctes = []
        for index, write in enumerate(writes):
            table = write.table
            values = {
                name: bindparam(f"p{index}_v_{name}", type_=table.c[name].type)
                for name in write.names
            }
            ctes.append(
                update(table)
                .where(table.c.id == bindparam(f"p{index}_pk"))
                .values(values)
                .returning(table.c.id)
                .cte(f"geneva_write_{index}")
            )
        return ctes

    def _combined_statement(
        self,
        shapes: _Shapes,
        writes: Sequence[Write],
        asynchronous_commit: bool,
        sweep: Sweep | None,
    ) -> Compiled:
        """``WITH u0 AS (UPDATE …), u1 AS (UPDATE …) SELECT …``: PostgreSQL runs every
        data-modifying CTE exactly once, to completion, whether or not it is referenced.
        All of them see the snapshot the statement started with."""
        key = (shapes, asynchronous_commit, sweep is not None)
        statement = self._combined.get(key)
        if statement is None:
            ctes = self._write_ctes(writes)
            if sweep is not None:
                swept = sweep.statement("s_", sweep.excluded(writes))
                ctes.append(swept.returning(sweep.executions.c.id).cte("geneva_sweep"))
            head = (
                func.set_config("synchronous_commit", "off", true())
                if asynchronous_commit
                else literal(1)
            )
            statement = self._combined[key] = Compiled(select(head).add_cte(*ctes))
        return statement


DIALECT = PostgreSQLDialect()


#: What psycopg says when poll() reports the server's hang-up (a terminated backend, a restart)
#: before libpq has read it (psycopg/waiting.py).
_SOCKET_CLOSED = "connection socket closed"


def _socket_closed_is_a_disconnect(context: ExceptionContext) -> None:
    """Count psycopg's "connection socket closed" as a lost connection.

    libpq has not marked the connection broken when psycopg raises it, so SQLAlchemy's
    ``is_disconnect`` says no: the connection is not invalidated, the executor's phase does not
    start again on a new one (engine/executor.py ``_lock_reconnecting``), and the rollback that
    follows fails with "another command is already in progress". It is a disconnect: the
    socket is gone.
    """
    if context.is_disconnect:
        return
    error = context.original_exception
    dbapi = context.dialect.loaded_dbapi
    if isinstance(error, dbapi.OperationalError) and _SOCKET_CLOSED in str(error):
        context.is_disconnect = True
