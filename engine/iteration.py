"""``IterableStep``: the cursor API of resumable steps.

A resumable step walks a large collection and checkpoints its cursor. Each checkpoint commits
the cursor together with whatever the step wrote through the workflow's session since the last
one, so progress and bookkeeping never disagree; then the executor may interrupt the step
(max_iterations, max_runtime, worker shutdown, an external pause or cancel) and a successor
execution continues from the cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, literal, tuple_, update
from sqlalchemy.exc import DBAPIError

from geneva_drive.errors import InvalidInputError, StepConfigurationError
from geneva_drive.flow_control import Interrupt
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.serialization import serialize_cursor
from geneva_drive.states import StepState

if TYPE_CHECKING:
    from geneva_drive.executor import Executor


class IterableStep:
    def __init__(self, name: str, execution: StepExecution, *, executor: Executor) -> None:
        self.name = name
        self.execution = execution
        self._executor = executor
        self.cursor: Any = execution.cursor_value
        #: True for every successor execution (continues_from is set), even with a None cursor.
        self.resumed = execution.continues_from_id is not None
        #: Checkpoints taken in *this* execution.
        self.iterations = 0
        self.advanced = False

    def __repr__(self) -> str:
        return f"<IterableStep {self.description}>"

    @property
    def description(self) -> str:
        return f"at '{self.name}', cursor {self.cursor!r}"

    # --- cursor moves --------------------------------------------------------------------

    def set(self, value: Any) -> None:
        """Move the cursor to ``value`` and checkpoint."""
        self.cursor = value
        self.advanced = True
        self.checkpoint()

    def advance(self) -> None:
        """Add one to an integer cursor (None counts as 0) and checkpoint."""
        current = 0 if self.cursor is None else self.cursor
        if isinstance(current, bool) or not isinstance(current, int):
            raise InvalidInputError(f"advance() requires an integer cursor, got {self.cursor!r}")
        self.set(current + 1)

    def checkpoint(self) -> None:
        """Persist the cursor (committing the step's work so far); maybe interrupt here."""
        self.iterations += 1
        self._persist()
        if self._executor.should_interrupt(self.iterations):
            raise Interrupt()

    def skip_to(self, value: Any, wait: timedelta | float | None = None) -> None:
        """Persist ``value`` and end this execution; a successor continues after ``wait``."""
        self.cursor = value
        self.advanced = True
        self._persist()
        if wait is not None and not isinstance(wait, timedelta):
            wait = timedelta(seconds=wait)
        raise Interrupt(wait)

    def _persist(self) -> None:
        data = serialize_cursor(self.cursor)
        session = self._executor.session
        try:
            # Only while the execution is still in progress: one an operator or housekeeping
            # closed meanwhile (canceled, skipped, moved past, recovered) is a discarded
            # attempt, whose writes since the last checkpoint must not commit.
            written = session.execute(
                update(StepExecution)
                .where(
                    StepExecution.id == self.execution.id,
                    StepExecution.state == StepState.IN_PROGRESS,
                )
                .values(cursor=data, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if not written.rowcount:  # type: ignore[attr-defined]
                session.rollback()
                self._executor.log.warning(
                    "execution closed while the step ran; its writes since the last "
                    "checkpoint were rolled back"
                )
                raise Interrupt()
            session.commit()
        except DBAPIError as error:
            session.rollback()
            if not error.connection_invalidated:
                raise  # the step's own writes were refused: the exception policy decides
            # The database connection died under the checkpoint (a restart, a failover, a
            # terminated backend): not the step's fault. End this execution as an interruption;
            # the successor continues from the last committed checkpoint, like after a crash.
            self._executor.log.warning(
                "database connection lost at a checkpoint; continuing from the last committed "
                "cursor in a new execution"
            )
            raise Interrupt() from error
        except BaseException:
            # The step's own writes failed to flush or commit with the cursor. Roll them back
            # so the session stays usable: the error goes to the exception policy like any
            # other, and the last committed checkpoint stays the cursor.
            session.rollback()
            raise

    # --- iteration helpers ---------------------------------------------------------------

    def iterate_over(self, iterable: Iterable[Any], fn: Callable[[Any], Any]) -> None:
        """Call ``fn`` for each element, with the element's index + 1 as the cursor."""
        if not hasattr(iterable, "__iter__"):
            raise InvalidInputError("iterate_over() needs an iterable")
        start = self.cursor or 0
        if isinstance(start, bool) or not isinstance(start, int):
            raise InvalidInputError(f"iterate_over() needs an integer cursor, got {self.cursor!r}")
        for index, element in enumerate(iterable):
            if index < start:
                continue
            fn(element)
            self.set(index + 1)

    def iterate_over_records(
        self,
        query: Select[Any],
        fn: Callable[[Any], Any],
        cursor_column: str | Sequence[str] = "id",
        batch_size: int = 1000,
    ) -> None:
        """Call ``fn`` for each row of ``query`` in ``cursor_column`` order; cursor = that value.

        ``cursor_column`` names a unique, ordered column of the selected entity, or several
        (``("created_at", "id")``) whose values together are unique; the cursor is then the
        list of those values and pages are compared as row values.
        """

        def each_batch(rows: list[Any]) -> None:
            for row in rows:
                fn(row)
                self.set(self._cursor_of(row, cursor_column))

        self._keyset(query, cursor_column, batch_size, each_batch)

    def iterate_over_batches(
        self,
        query: Select[Any],
        fn: Callable[[list[Any]], Any],
        batch_size: int = 1000,
        cursor_column: str | Sequence[str] = "id",
    ) -> None:
        """Call ``fn`` with lists of up to ``batch_size`` rows; cursor = the batch's last value."""

        def each_batch(rows: list[Any]) -> None:
            fn(rows)
            self.set(self._cursor_of(rows[-1], cursor_column))

        self._keyset(query, cursor_column, batch_size, each_batch)

    @staticmethod
    def _cursor_of(row: Any, cursor_column: str | Sequence[str]) -> Any:
        if isinstance(cursor_column, str):
            return getattr(row, cursor_column)
        return [getattr(row, name) for name in cursor_column]

    def _keyset(
        self,
        query: Select[Any],
        cursor_column: str | Sequence[str],
        batch_size: int,
        each_batch: Callable[[list[Any]], None],
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise StepConfigurationError(
                f"batch_size must be a positive integer, got {batch_size!r}"
            )
        names = [cursor_column] if isinstance(cursor_column, str) else list(cursor_column)
        entity = query.column_descriptions[0]["entity"]
        if (
            not names
            or entity is None
            or not all(isinstance(n, str) and hasattr(entity, n) for n in names)
        ):
            raise StepConfigurationError(
                f"cursor_column {cursor_column!r} is not an attribute of the query's entity; "
                "select a mapped class and name one of its unique, ordered columns (or a tuple "
                "of columns that are unique together)"
            )
        columns = [getattr(entity, n) for n in names]
        session = self._executor.session
        while True:
            page = query.order_by(None).order_by(*columns)
            if self.cursor is not None:
                # Keyset: an index range scan from the cursor on, never OFFSET.
                page = page.where(self._after(columns, self.cursor, cursor_column))
            rows = list(session.scalars(page.limit(batch_size)))
            if not rows:
                return
            each_batch(rows)
            if len(rows) < batch_size:
                return

    @staticmethod
    def _after(columns: list[Any], cursor: Any, cursor_column: str | Sequence[str]) -> Any:
        if isinstance(cursor_column, str):
            return columns[0] > cursor
        if not isinstance(cursor, list | tuple) or len(cursor) != len(columns):
            raise StepConfigurationError(
                f"cursor {cursor!r} does not fit cursor_column {tuple(cursor_column)!r}: a "
                f"composite keyset cursor is a list of {len(columns)} values"
            )
        # A row-value comparison: (a, b) > (x, y), served by an index on (a, b).
        values = [literal(v, type_=c.type) for c, v in zip(columns, cursor, strict=True)]
        return tuple_(*columns) > tuple_(*values)
