"""MariaDB and MySQL (one module: SQLAlchemy serves both with one dialect and tells them apart
by the server version it reads on the first connection).

Connections run at READ COMMITTED, not InnoDB's default REPEATABLE READ, on purpose:

- The engine's read-after-conflict paths need to see rows other transactions committed after
  this one began: a signal whose idempotency key lost the race to a concurrent delivery reads
  the winner's row after the duplicate-key error (REPEATABLE READ would read from the
  transaction's first snapshot and find nothing), and a workflow lock taken after waiting
  must be read with the state the other side committed. PostgreSQL, where the engine was
  written, runs READ COMMITTED by default; every lock section was designed for it.
- Measured: at REPEATABLE READ tests/engine/test_signals_race.py fails on MariaDB.
  A gate that parks its step reads the workflow's signals in a snapshot older than a signal
  committed meanwhile, and no one wakes the step: a lost wake-up.
- REPEATABLE READ makes locking reads and unique checks take gap and next-key locks: two
  workers inserting the next executions of different workflows, or the dispatcher's
  ``FOR UPDATE SKIP LOCKED`` scan, then lock ranges of the (state, scheduled_for) and
  one-active indexes and deadlock against each other. READ COMMITTED locks only the rows
  it reads and releases those a scan did not keep.

The session's time zone is UTC (``SET time_zone = '+00:00'``): DATETIME columns hold naive UTC,
and the server's own clock functions must agree with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    Column,
    Connection,
    Select,
    Table,
    bindparam,
    func,
    literal,
    literal_column,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine.interfaces import Dialect as SQLAlchemyDialect
from sqlalchemy.engine.url import make_url

from geneva_drive.compiled import Compiled
from geneva_drive.dialects.base import Dialect, Sweep, Write, _Ts, combined_params

#: The isolation level of MariaDB/MySQL connections (see the module docstring).
MYSQL_ISOLATION_LEVEL = "READ COMMITTED"

_Shapes = tuple[tuple[str, tuple[str, ...]], ...]


def is_mariadb(dialect: SQLAlchemyDialect) -> bool:
    return bool(getattr(dialect, "is_mariadb", False))


def mysql_collation(dialect: SQLAlchemyDialect) -> str:
    """The binary NO PAD utf8mb4 collation of this MariaDB or MySQL server."""
    return "utf8mb4_nopad_bin" if is_mariadb(dialect) else "utf8mb4_0900_bin"


class MySQLDialect(Dialect):
    """Row locks and SKIP LOCKED as on PostgreSQL; no partial indexes (generated columns stand
    in), no data-modifying CTEs (a multi-table UPDATE does their work), DATETIME(6) as naive
    UTC; JSON native on MySQL, LONGTEXT on MariaDB."""

    name: ClassVar[str] = "mysql"
    sqlalchemy_names: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    partial_indexes: ClassVar[bool] = False
    naive_datetimes: ClassVar[bool] = True
    test_isolation: ClassVar[str] = "database"

    def lock_or_create(self, connection: Connection, table: Table, key: str, value: Any) -> None:
        # ON DUPLICATE KEY UPDATE takes the row's exclusive lock, existing or new. An INSERT
        # IGNORE then SELECT ... FOR UPDATE would upgrade a shared lock, which InnoDB turns into
        # deadlocks when three transactions create the same row at once.
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        statement = mysql_insert(table).values({key: value})
        connection.execute(statement.on_duplicate_key_update({key: statement.inserted[key]}))

    def __init__(self) -> None:
        self._joined: dict[tuple[_Shapes, bool], Compiled] = {}

    def session_options(self, url: str, options: dict[str, Any] | None) -> dict[str, Any]:
        """READ COMMITTED, utf8mb4 and a UTC session (module docstring)."""
        query = make_url(url).query
        merged = dict(options or {})
        merged.setdefault("isolation_level", MYSQL_ISOLATION_LEVEL)
        connect_args = dict(merged.get("connect_args") or {})
        if "charset" not in query:
            connect_args.setdefault("charset", "utf8mb4")
        if "init_command" not in query:
            connect_args.setdefault("init_command", "SET time_zone = '+00:00'")
        merged["connect_args"] = connect_args
        return merged

    def lock_candidates_first(self) -> bool:
        # InnoDB locks every row its scan reads before it tests the WHERE clause.
        return True

    def through_index(self, query: Select[*_Ts], table: Table, index: str) -> Select[*_Ts]:
        for name in self.sqlalchemy_names:
            query = query.with_hint(table, f"FORCE INDEX ({index})", name)
        return query

    def datetime_impl(self, dialect: SQLAlchemyDialect) -> Any:
        # A plain DATETIME drops the microseconds the engine orders and compares by.
        return dialect.type_descriptor(mysql.DATETIME(fsp=6))

    def json_impl(self, dialect: SQLAlchemyDialect) -> Any:
        # MariaDB's JSON is LONGTEXT with a json_valid CHECK constraint named after the
        # column, which reflection and the autogenerate check see as a stray constraint.
        if is_mariadb(dialect):
            return dialect.type_descriptor(mysql.LONGTEXT())
        return dialect.type_descriptor(mysql.JSON())

    def json_native(self, dialect: SQLAlchemyDialect) -> bool:
        return not is_mariadb(dialect)

    def before_create(self, connection: Connection, tables: Iterable[Table]) -> None:
        for table in tables:
            if table.name.startswith("geneva_drive_"):
                table.dialect_options["mysql"]["collate"] = mysql_collation(connection.dialect)

    def upsert_adding(
        self, table: Table, values: list[dict[str, Any]], keys: Sequence[Column[Any]], column: str
    ) -> Any:
        # ON DUPLICATE KEY: the primary key (``keys``) is the only unique key it can hit.
        statement = mysql.insert(table).values(values)
        return statement.on_duplicate_key_update(
            {column: table.c[column] + statement.inserted[column]}
        )

    def insert_unless_duplicate(self, table: Table) -> Any:
        # INSERT IGNORE: neither server has ON CONFLICT DO NOTHING, and ON DUPLICATE KEY
        # UPDATE reports a kept row as 1 under the driver's FOUND_ROWS flag, like an insert.
        # IGNORE also turns other errors into warnings; the callers insert the engine's own
        # values (ids of rows they hold locked, fixed names), which can only meet the key.
        return mysql.insert(table).prefix_with("IGNORE")

    def epoch_seconds(self, column: Any) -> Any:
        # The column holds UTC; no session time zone involved.
        return func.timestampdiff(literal_column("SECOND"), literal("1970-01-01 00:00:00"), column)

    def write_updates(
        self,
        connection: Connection,
        writes: Sequence[Write],
        *,
        asynchronous_commit: bool,
        sweep: Sweep | None,
    ) -> bool:
        """A flush's UPDATEs (and the sweep) as one multi-table UPDATE.

        Neither server has data-modifying CTEs nor ``UPDATE … RETURNING``, but a multi-table
        UPDATE changes every row of its join once, in one statement: the written rows are
        joined by id (each matches exactly one row), the sweep's strays by a LEFT JOIN that
        may match none (its SET then changes nothing). An inner join that finds one of the
        rows gone would write none of them, so a statement that matched fewer rows than it
        writes is done again row by row, the sweep first, as the other backends do. There is
        no per-transaction commit durability (``innodb_flush_log_at_trx_commit`` is
        server-wide), so ``asynchronous_commit`` changes nothing here.
        """
        if len(writes) <= 1 and sweep is None:
            return False
        shapes = tuple((write.table.name, write.names) for write in writes)
        combined = combined_params(writes, sweep)
        matched = self._joined_statement(shapes, writes, sweep).execute(connection, combined)
        if matched >= len(writes):
            return True
        if sweep is not None:
            Compiled(sweep.statement("s_", sweep.excluded(writes))).execute(connection, combined)
        return False

    def _joined_statement(
        self, shapes: _Shapes, writes: Sequence[Write], sweep: Sweep | None
    ) -> Compiled:
        """``UPDATE t AS u0 JOIN t1 AS u1 ON u1.id = :p1_pk [LEFT JOIN executions AS s ON …]
        SET u0.c = :p0_v_c, …, s.state = 'canceled', … WHERE u0.id = :p0_pk``."""
        key = (shapes, sweep is not None)
        statement = self._joined.get(key)
        if statement is not None:
            return statement
        binds: dict[str, Any] = {}
        joins: list[str] = []
        assignments: list[str] = []
        for index, write in enumerate(writes):
            table, table_name = write.table, write.table.name
            alias = f"u{index}"
            binds[f"p{index}_pk"] = bindparam(f"p{index}_pk", type_=table.c.id.type)
            if index == 0:
                joins.append(f"`{table_name}` AS {alias}")
            else:
                joins.append(f"JOIN `{table_name}` AS {alias} ON {alias}.id = :p{index}_pk")
            for name in write.names:
                bind = f"p{index}_v_{name}"
                binds[bind] = bindparam(bind, type_=table.c[name].type)
                assignments.append(f"{alias}.`{name}` = :{bind}")
        if sweep is not None:
            executions = sweep.executions
            stray = ", ".join(f"'{state}'" for state in sorted(sweep.stray_states))
            excluded = "".join(f" AND s.id <> :{bind}" for bind in sweep.excluded(writes))
            joins.append(
                f"LEFT JOIN `{executions.name}` AS s ON s.workflow_id = :s_workflow_id "
                f"AND s.state IN ({stray}){excluded}"
            )
            binds["s_workflow_id"] = bindparam("s_workflow_id", type_=executions.c.workflow_id.type)
            binds["s_now"] = bindparam("s_now", type_=executions.c.updated_at.type)
            # The sweep's columns from the one state writer (transitions.swept_columns), as the
            # other backends' sweep writes them: finished_at included.
            now_marker = object()
            for name, value in sweep.columns(now_marker).items():
                assignments.append(
                    f"s.`{name}` = :s_now" if value is now_marker else f"s.`{name}` = '{value}'"
                )
        sql = f"UPDATE {' '.join(joins)} SET {', '.join(assignments)} WHERE u0.id = :p0_pk"
        statement = self._joined[key] = Compiled(text(sql).bindparams(*binds.values()))
        return statement


DIALECT = MySQLDialect()
