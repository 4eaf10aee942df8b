"""The executor's hot statements, compiled once per dialect and run on the driver's cursor.

A step runs the same six statements every time (two lock reads, the phase writes, the next
execution's INSERT, the stray sweep), only the bound values change. SQLAlchemy's execute path
rebuilds an execution context, its parameter and result-processing machinery and (psycopg)
a description of every result column on each call: on PostgreSQL about 110 µs of Python per
lock read against 65 µs for the driver alone (bench/NOTES.md), a sizeable part of a hop.

:class:`Compiled` keeps what that path derives per call - the SQL string, the bind-parameter
processors and order, the result-column processors - for each dialect it has met, and runs the
statement through ``Connection._cursor_execute`` (:mod:`geneva_drive.sqla_internals`): the hook SQLAlchemy itself uses for its
special-case executions, so ``before_cursor_execute``/``after_cursor_execute`` listeners still
see every statement, echo logging still works, and a driver error still becomes the
``sqlalchemy.exc`` exception it would have been, invalidating a dead connection in the pool.

Only statements built for it qualify: no expanding or literal-execute parameters, no escaped
bind names, no column left to a Python-side default (checked when compiled). tests/engine/test_compiled.py compares every statement's
rows and effects with SQLAlchemy's own execution on both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from geneva_drive import sqla_internals
from geneva_drive.errors import InvalidInputError

_Processor = Callable[[Any], Any]


@dataclass(frozen=True)
class _Form:
    """One statement as one dialect runs it."""

    sql: str
    #: Bind names in placeholder order (qmark/numeric dialects); None for named placeholders.
    order: tuple[str, ...] | None
    #: Values the statement binds itself (``.values(state='canceled')``).
    defaults: Mapping[str, Any]
    #: Bind names the caller must give a value for.
    required: frozenset[str]
    processors: Mapping[str, _Processor]
    #: Per result column: its processor or None.
    results: tuple[_Processor | None, ...]
    #: (index, processor) of the result columns that have one: a lock row has 46 columns,
    #: fewer than half of them processed, and each is read once per step.
    processed: tuple[tuple[int, _Processor], ...]


class Compiled:
    """A Core statement run on the DBAPI cursor with SQLAlchemy's own type processing."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        # Per dialect instance (one per engine); weak, so engines that go away (a test
        # suite makes one per database) take their forms with them.
        self._forms: WeakKeyDictionary[Dialect, _Form] = WeakKeyDictionary()

    def _form(self, dialect: Dialect) -> _Form:
        form = self._forms.get(dialect)
        if form is None:
            form = self._forms[dialect] = _compile(self.statement, dialect)
        return form

    def _parameters(self, form: _Form, params: Mapping[str, Any]) -> Any:
        if not form.required.issubset(params):
            missing = sorted(form.required.difference(params))
            raise InvalidInputError(f"{form.sql!r} needs a value for {', '.join(missing)}")
        values = dict(form.defaults)
        values.update(params)
        for name, processor in form.processors.items():
            value = values[name]
            if value is not None:
                values[name] = processor(value)
        if form.order is None:
            return values
        return tuple(values[name] for name in form.order)

    def _run(self, connection: Connection, params: Mapping[str, Any]) -> tuple[Any, _Form]:
        form = self._form(connection.dialect)
        parameters = self._parameters(form, params)
        if not connection.in_transaction():
            connection.begin()  # as Connection.execute() autobegins
        cursor = connection.connection.cursor()
        try:
            sqla_internals.cursor_execute(connection, cursor, form.sql, parameters)
        except BaseException:
            cursor.close()
            raise
        return cursor, form

    def execute(self, connection: Connection, params: Mapping[str, Any]) -> int:
        """Run a statement that returns no rows; the number of rows it changed."""
        cursor, _form = self._run(connection, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def first(self, connection: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row, its values processed as SQLAlchemy would; None without one."""
        cursor, form = self._run(connection, params)
        try:
            row: Sequence[Any] | None = cursor.fetchone()
        finally:
            cursor.close()
        if row is None:
            return None
        values = list(row)
        for index, processor in form.processed:
            value = values[index]
            if value is not None:
                values[index] = processor(value)
        return tuple(values)

    def lastrowid(self, connection: Connection, params: Mapping[str, Any]) -> int:
        """Run an INSERT; the new row's id (``RETURNING`` where compiled with it)."""
        cursor, form = self._run(connection, params)
        try:
            if form.results:
                row = cursor.fetchone()
                assert row is not None, "INSERT ... RETURNING returned no row"
                return int(row[0])
            return int(cursor.lastrowid)
        finally:
            cursor.close()


def _compile(statement: ClauseElement, dialect: Dialect) -> _Form:
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    if (
        compiled.escaped_bind_names
        or compiled.literal_execute_params
        or compiled.post_compile_params
    ):
        raise InvalidInputError(
            "geneva_drive.compiled runs plain statements only: no escaped, expanding or "
            f"literal-execute parameters in {compiled.string!r}"
        )
    prefetch = [column.name for column in (*compiled.insert_prefetch, *compiled.update_prefetch)]
    if prefetch:
        # Python-side defaults (``default=``/``onupdate=``) are computed by SQLAlchemy's
        # execution context, which this path skips: the statement must bind them itself.
        raise InvalidInputError(
            f"geneva_drive.compiled needs {', '.join(prefetch)} bound explicitly: SQLAlchemy would "
            f"compute the column's Python-side default, which this path does not ({compiled.string!r})"
        )
    required = frozenset(
        name
        for bind, name in compiled.bind_names.items()
        if bind.required and bind.callable is None
    )
    defaults = {
        name: value
        for name, value in sqla_internals.bound_defaults(compiled).items()
        if name not in required
    }
    processors: dict[str, _Processor] = {}
    for name, processor in sqla_internals.bind_processors(compiled).items():
        if callable(processor):
            processors[name] = processor
        elif processor is not None:  # a sequence: a tuple-valued bind
            raise InvalidInputError(f"geneva_drive.compiled has no tuple-valued binds ({name!r})")
    results = sqla_internals.result_processors(compiled, dialect)
    order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    processed = tuple(
        (index, processor) for index, processor in enumerate(results) if processor is not None
    )
    return _Form(compiled.string, order, defaults, required, processors, results, processed)


__all__ = ["Compiled"]
