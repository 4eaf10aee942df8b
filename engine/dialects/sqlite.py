"""SQLite: no row locks (a lock section holds the database write lock), JSON as text, naive
UTC datetimes, one UPDATE per written row."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import Column, Connection, Engine, Integer, Table, cast, event, func, literal_column
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session

from geneva_drive.dialects.base import Dialect

SQLITE_BUSY_TIMEOUT_MS = 30_000


class SQLiteDialect(Dialect):
    """SQLite has no row locks: a "lock" means holding the database write lock, taken with
    ``BEGIN IMMEDIATE`` at the start of the lock section (pysqlite's legacy transaction mode
    only opens a transaction at the first write, so a section that reads before it writes
    would otherwise run outside any transaction and another writer could slip in between).
    WAL mode lets readers go on meanwhile; ``busy_timeout`` makes a second writer wait
    instead of failing."""

    name: ClassVar[str] = "sqlite"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("sqlite",)
    row_locks: ClassVar[bool] = False
    combined_flush: ClassVar[bool] = False
    naive_datetimes: ClassVar[bool] = True
    idle_ping: ClassVar[bool] = False
    test_isolation: ClassVar[str] = "file"

    def lock_or_create(self, connection: Connection, table: Table, key: str, value: Any) -> None:
        # No row locks: the database write lock, held since begin_write(), already serializes
        # every claim; the row is only created.
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        connection.execute(sqlite_insert(table).values({key: value}).on_conflict_do_nothing())

    def engine_options(self, url: str, options: dict[str, Any]) -> dict[str, Any]:
        database = make_url(url).database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        options.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        return options

    def install(self, engine: Engine) -> None:
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

    def adopt(self, engine: Engine) -> None:
        # WAL and busy_timeout, as the engine's own connections get: operator actions take
        # the write lock (BEGIN IMMEDIATE) and must wait for a worker's commit, not fail.
        self.install(engine)
        engine.dispose()

    def begin_write(self, session: Session) -> None:
        connection = session.connection()
        dbapi_connection = connection.connection.dbapi_connection
        if dbapi_connection is not None and not dbapi_connection.in_transaction:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    def without_index(self, column: Any) -> Any:
        # SQLite, without statistics, prefers any index with an equality on state over a
        # range of the index the query is written for; a unary + keeps a term off every index.
        return literal_column(f"+{column.table.name}.{column.name}", column.type)

    def off_index_predicate(self, predicate: str) -> str:
        return f"+{predicate}"

    def upsert_adding(
        self, table: Table, values: list[dict[str, Any]], keys: Sequence[Column[Any]], column: str
    ) -> Any:
        statement = sqlite_insert(table).values(values)
        return statement.on_conflict_do_update(
            index_elements=list(keys),
            set_={column: table.c[column] + statement.excluded[column]},
        )

    def insert_unless_duplicate(self, table: Table) -> Any:
        return sqlite_insert(table).on_conflict_do_nothing()

    def epoch_seconds(self, column: Any) -> Any:
        return cast(func.strftime("%s", column), Integer)


DIALECT = SQLiteDialect()
