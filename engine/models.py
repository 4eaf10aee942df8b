"""Typed SQLAlchemy models: the schema (docs/MANUAL.md, "Core concepts").

``Base`` is the engine's ``DeclarativeBase``; its metadata is what Flask-SQLAlchemy and
Flask-Migrate are bound to, and what the test fixture creates. Applications may map their own
hero models on it or on any other base.

The workflow model itself (``Workflow``) lives in :mod:`geneva_drive.workflow` because workflow
classes are single-table-inheritance subclasses of it; it is re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    event,
    func,
    text,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from geneva_drive import dialects
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.serialization import deserialize, serialize_cursor
from geneva_drive.states import CURRENT_STEP_STATES, Outcome, SignalState, StepState, is_overdue

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


#: Every table the engine owns (its migration history creates exactly these).
ENGINE_TABLE_NAMES = frozenset(
    {
        "geneva_drive_workflows",
        "geneva_drive_step_executions",
        "geneva_drive_signals",
        "geneva_drive_operator_actions",
        "geneva_drive_dashboard_sessions",
        "geneva_drive_limits",
        "geneva_drive_workflow_counts",
        "geneva_drive_execution_minutes",
        "geneva_drive_execution_hours",
        "geneva_drive_rollup_marks",
        "geneva_drive_workers",
        "geneva_drive_leases",
        "geneva_drive_schedules",
    }
)

#: The backends with partial indexes (``CREATE INDEX … WHERE``), by SQLAlchemy's names.
PARTIAL_INDEX_DIALECTS = dialects.PARTIAL_INDEX_DIALECTS


#: Table options on MariaDB/MySQL: utf8mb4 with a binary NO PAD collation, so that names,
#: types and idempotency keys compare exactly as on PostgreSQL and SQLite. The servers' default
#: ``*_general_ci`` collations would make "Welcome" and "welcome" the same signal name, and the
#: PAD SPACE ones (``utf8mb4_bin`` too) make "k" and "k " the same idempotency key; both would
#: collide in the unique indexes. The collation is named per server when the tables are created
#: (``mysql_collation``): MariaDB's is ``utf8mb4_nopad_bin``, MySQL 8's ``utf8mb4_0900_bin``.
MYSQL_TABLE_OPTIONS = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_nopad_bin"}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    PostgreSQL stores ``timestamptz``. SQLite and MariaDB/MySQL have no zone: values are
    stored as naive UTC and come back tagged as UTC; on MariaDB/MySQL as ``DATETIME(6)``,
    since a plain DATETIME drops the microseconds the engine orders and compares by.
    Naive values handed in are taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        return dialect_for(dialect).datetime_impl(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect_for(dialect).naive_datetimes:
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JSONType(TypeDecorator[Any]):
    """JSONB on PostgreSQL, ``json`` on MySQL, JSON-in-TEXT elsewhere (docs/MANUAL.md, "Databases").

    MariaDB has no JSON type: its ``JSON`` is LONGTEXT with a ``json_valid`` CHECK constraint
    named after the column, which reflection and the autogenerate check see as a text column
    with a stray constraint. There the column is a plain LONGTEXT and the values are encoded
    and decoded here, as on SQLite.
    """

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        return dialect_for(dialect).json_impl(dialect)

    @staticmethod
    def _native(dialect: Dialect) -> bool:
        """The driver-side JSON type encodes and decodes (PostgreSQL, MySQL)."""
        return dialect_for(dialect).json_native(dialect)

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or self._native(dialect):
            return value
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None or self._native(dialect):
            return value
        return json.loads(value)


# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    # Plain (non-column) instance attributes such as Workflow.received_signal are allowed.
    __allow_unmapped__ = True
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType()}


class TimestampMixin:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        UTCDateTime(), default=utcnow, onupdate=utcnow, nullable=False
    )


_ONE_ACTIVE = "state IN ('scheduled', 'in_progress')"
_IN_PROGRESS = "state = 'in_progress'"
_WAITING = "state = 'waiting'"
_TIMED_OUT = "timed_out_at IS NOT NULL"
_SCHEDULED = "state = 'scheduled'"
_FAILED = "state = 'failed'"
# Concurrency and rate limits (docs/MANUAL.md, "Concurrency and rate limits", migration 0008): only limited rows are indexed.
_LIMIT_SLOT = "limit_slot IS NOT NULL"
_STEP_LIMIT_SLOT = "step_limit_slot IS NOT NULL"
_RATE_SLOT = "rate_slot IS NOT NULL"
_DEFERRED = "deferred_on IS NOT NULL"
_PENDING = "state = 'pending'"
#: Finished or canceled workflows (housekeeping's cleanup candidates; index in workflow.py).
TERMINAL_WORKFLOW_PREDICATE = "state IN ('finished', 'canceled')"


class StepExecution(TimestampMixin, Base):
    """One attempt at one step of one workflow. Every attempt is a row; nothing is updated away."""

    __tablename__ = "geneva_drive_step_executions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    workflow_id: Mapped[int] = mapped_column(
        BigId,
        ForeignKey("geneva_drive_workflows.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    )
    step_name: Mapped[str] = mapped_column(String(255), nullable=False)
    state: Mapped[str] = mapped_column(
        String(32), nullable=False, default=StepState.SCHEDULED, server_default=StepState.SCHEDULED
    )
    outcome: Mapped[str | None] = mapped_column(String(32))
    scheduled_for: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    canceled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    skipped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), index=True)
    error_class_name: Mapped[str | None] = mapped_column(String(255))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_backtrace: Mapped[str | None] = mapped_column(Text)
    job_id: Mapped[str | None] = mapped_column(String(255))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType())
    cursor: Mapped[Any] = mapped_column(JSONType(), nullable=True)
    continues_from_id: Mapped[int | None] = mapped_column(BigId, index=True)
    signal_id: Mapped[int | None] = mapped_column(BigId, index=True)
    waiting_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: When the dispatcher (or the commit hook) last handed this execution to the transport.
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: When the wait of a step with ``timeout=`` runs out (docs/MANUAL.md, "Time-bounded waits"): set when the execution
    #: parks (``waiting_since`` + the time-out), or by the first sweep that sees an execution
    #: parked before its step had a time-out (engine/timeouts.py). NULL for every other step.
    timeout_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: When that time-out fired: the record that it did (outcome ``timed_out`` may be replaced
    #: by a reattempt of an ``on_timeout="run"`` body), and what lets such a body pass the gate
    #: without a signal.
    timed_out_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Concurrency and rate limits (docs/MANUAL.md, "Concurrency and rate limits", engine/limits.py): the ``name/key`` slots this
    #: execution counts against, evaluated when it was created. ``limit_slot``: the class's
    #: ``concurrency_limit``; ``step_limit_slot``: the step's; ``rate_slot``: the step's
    #: ``rate_limit``. NULL for every execution without a limit (nothing is written for them).
    limit_slot: Mapped[str | None] = mapped_column(String(255))
    step_limit_slot: Mapped[str | None] = mapped_column(String(255))
    rate_slot: Mapped[str | None] = mapped_column(String(255))
    #: The slot a deferred execution waits for (it found no free slot or token at its start);
    #: cleared when it starts. Its place in line is its id.
    deferred_on: Mapped[str | None] = mapped_column(String(255))
    #: When a limit first held this execution back (its ``scheduled_for`` moves with each
    #: recheck, so the wait's start is kept here); kept after it starts. NULL: never deferred,
    #: or deferred before migration 0015 (engine/lateness.py then uses ``created_at``).
    deferred_since: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: The worker process that started this execution (``geneva_drive_workers``), written by the
    #: statement that marks it ``in_progress``. While that worker's lease holds, the execution is
    #: never recovered however long it runs; once the lease expires it is recovered at the next
    #: sweep (engine/liveness.py). NULL: started outside a registered worker (the test helpers,
    #: an older version), judged by ``stuck_in_progress_threshold`` as before.
    worker_id: Mapped[int | None] = mapped_column(BigId)

    workflow: Mapped[Workflow] = relationship()
    successor: Mapped[StepExecution | None] = relationship(
        primaryjoin="StepExecution.id == foreign(StepExecution.continues_from_id)",
        uselist=False,
        viewonly=True,
    )
    continues_from: Mapped[StepExecution | None] = relationship(
        primaryjoin="foreign(StepExecution.continues_from_id) == StepExecution.id",
        remote_side="StepExecution.id",
        uselist=False,
        viewonly=True,
    )
    signal: Mapped[Signal | None] = relationship(
        primaryjoin="foreign(StepExecution.signal_id) == Signal.id", viewonly=True
    )

    __table_args__ = (
        Index("index_geneva_drive_step_executions_scheduled", "state", "scheduled_for"),
        Index(
            "index_geneva_drive_step_executions_on_workflow_created", "workflow_id", "created_at"
        ),
        Index("index_geneva_drive_step_executions_on_workflow_state", "workflow_id", "state"),
        # The dashboard's error filter (migration 0002): failed executions of one error class.
        Index(
            "index_geneva_drive_step_executions_on_error_class",
            "error_class_name",
            "state",
            "workflow_id",
        ),
        Index(
            "index_geneva_drive_step_executions_one_active",
            "workflow_id",
            unique=True,
            postgresql_where=text(_ONE_ACTIVE),
            sqlite_where=text(_ONE_ACTIVE),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        Index(
            "index_geneva_drive_step_executions_in_progress_started_at",
            "started_at",
            postgresql_where=text(_IN_PROGRESS),
            sqlite_where=text(_IN_PROGRESS),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # The time-out sweep (migration 0005): parked executions by deadline. Only parked rows
        # are in it, so steps that never wait for a signal cost it nothing.
        Index(
            "index_geneva_drive_step_executions_waiting_timeout",
            "timeout_at",
            postgresql_where=text(_WAITING),
            sqlite_where=text(_WAITING),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # The dashboard's "timed_out" filter: the workflows with an execution that timed out,
        # a range of this index that holds only timed-out rows.
        Index(
            "index_geneva_drive_step_executions_timed_out",
            "timed_out_at",
            "workflow_id",
            postgresql_where=text(_TIMED_OUT),
            sqlite_where=text(_TIMED_OUT),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # The dispatcher's claim (migration 0007): due work in (scheduled_for, id) order, read
        # off the index, so a burst at one instant is never re-sorted per batch. PostgreSQL
        # only: SQLite's and InnoDB's (state, scheduled_for) index carries the rowid / primary
        # key, which already gives that order within one state.
        Index(
            "index_geneva_drive_step_executions_due",
            "scheduled_for",
            "id",
            postgresql_where=text(_SCHEDULED),
        ).ddl_if(dialect="postgresql"),
        # The failures page (migration 0007): recent failures only, not every failure ever.
        # SQLite: a full index (only failed rows have failed_at), as its planner without
        # statistics would not pick the partial one (dashboard queries._off_index).
        Index(
            "index_geneva_drive_step_executions_failed_at",
            "failed_at",
            postgresql_where=text(_FAILED),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # Limits (migration 0008): a slot's executions in progress, its recent starts, and
        # its deferred executions in line. Only limited rows are in them.
        Index(
            "index_geneva_drive_step_executions_limit_slot",
            "limit_slot",
            "state",
            postgresql_where=text(_LIMIT_SLOT),
            sqlite_where=text(_LIMIT_SLOT),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        Index(
            "index_geneva_drive_step_executions_step_limit_slot",
            "step_limit_slot",
            "state",
            postgresql_where=text(_STEP_LIMIT_SLOT),
            sqlite_where=text(_STEP_LIMIT_SLOT),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        Index(
            "index_geneva_drive_step_executions_rate_slot",
            "rate_slot",
            "started_at",
            postgresql_where=text(_RATE_SLOT),
            sqlite_where=text(_RATE_SLOT),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        Index(
            "index_geneva_drive_step_executions_deferred_on",
            "deferred_on",
            "state",
            "id",
            postgresql_where=text(_DEFERRED),
            sqlite_where=text(_DEFERRED),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # MariaDB/MySQL build the partial indexes above (the dispatch one aside) under the
        # same names from MYSQL_FORMS below.
        MYSQL_TABLE_OPTIONS,
    )

    def __repr__(self) -> str:
        return (
            f"<StepExecution id={self.id} workflow_id={self.workflow_id} "
            f"step={self.step_name!r} state={self.state} outcome={self.outcome}>"
        )

    @property
    def metadata_dict(self) -> dict[str, Any]:
        return dict(self.metadata_ or {})

    def merge_metadata(self, **values: Any) -> None:
        merged = self.metadata_dict
        merged.update(values)
        self.metadata_ = merged

    @property
    def cursor_value(self) -> Any:
        """The deserialized cursor (dates, datetimes, UUIDs and decimals come back typed)."""
        return deserialize(self.cursor)

    @cursor_value.setter
    def cursor_value(self, value: Any) -> None:
        self.cursor = serialize_cursor(value)

    @property
    def is_overdue(self) -> bool:
        return is_overdue(self.state, self.scheduled_for, utcnow() - settings.overdue_after)

    @property
    def is_active(self) -> bool:
        return self.state in CURRENT_STEP_STATES

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None:
            return None
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class Signal(TimestampMixin, Base):
    """An external event delivered to one workflow."""

    __tablename__ = "geneva_drive_signals"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    workflow_id: Mapped[int] = mapped_column(
        BigId,
        ForeignKey("geneva_drive_workflows.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    )
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(
        String(32), nullable=False, default=SignalState.PENDING, server_default=SignalState.PENDING
    )
    payload_json: Mapped[Any] = mapped_column("payload", JSONType(), nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    consumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claimed: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")
    consumed: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")

    workflow: Mapped[Workflow] = relationship()

    __table_args__ = (
        Index(
            "index_geneva_drive_signals_dedup",
            "workflow_id",
            "name",
            "idempotency_key",
            unique=True,
        ),
        Index("index_geneva_drive_signals_on_workflow_state", "workflow_id", "state"),
        # The signal inbox (migration 0007): pending signals oldest first, not every signal.
        Index(
            "index_geneva_drive_signals_pending",
            "created_at",
            "id",
            postgresql_where=text(_PENDING),
            sqlite_where=text(_PENDING),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        MYSQL_TABLE_OPTIONS,
    )

    #: True only on the instance returned by a deduplicated ``signal()`` call (not a column).
    duplicate_delivery: bool = False

    def __repr__(self) -> str:
        return (
            f"<Signal id={self.id} workflow_id={self.workflow_id} name={self.name!r} "
            f"state={self.state} claimed={self.claimed} consumed={self.consumed}>"
        )

    @property
    def payload(self) -> Any:
        return deserialize(self.payload_json)

    @property
    def is_claimed(self) -> bool:
        return (self.claimed or 0) > 0

    @property
    def is_consumed(self) -> bool:
        return (self.consumed or 0) > 0


class OperatorAction(Base):
    """The dashboard's audit log: one row per operator action (who, what, when, result)."""

    __tablename__ = "geneva_drive_operator_actions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    # No foreign key: the audit trail outlives workflows deleted by housekeeping.
    workflow_id: Mapped[int | None] = mapped_column(BigId, index=True)
    actor: Mapped[str] = mapped_column(String(255), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSONType())
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str | None] = mapped_column(String(32))
    result: Mapped[str] = mapped_column(String(32), nullable=False)
    message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(
        UTCDateTime(), default=utcnow, nullable=False, index=True
    )

    __table_args__ = (
        # The audit page's filters (migration 0006): newest first within one actor or action.
        Index("index_geneva_drive_operator_actions_on_actor", "actor", "id"),
        Index("index_geneva_drive_operator_actions_on_action", "action", "id"),
        MYSQL_TABLE_OPTIONS,
    )

    def __repr__(self) -> str:
        return f"<OperatorAction id={self.id} {self.actor} {self.action} wf={self.workflow_id}>"


class LimitSlot(Base):
    """One row per ``(limit name, key)`` slot (docs/MANUAL.md, "Concurrency and rate limits", engine/limits.py): the row every
    claim of that slot locks, so that the count it then reads cannot change under it. It holds
    no counter: the executions' own states are the count."""

    __tablename__ = "geneva_drive_limits"

    slot: Mapped[str] = mapped_column(String(255), primary_key=True)
    __table_args__ = (MYSQL_TABLE_OPTIONS,)


class Worker(Base):
    """One process that runs steps: a Celery pool process or an embedded worker
    (engine/liveness.py). It renews ``heartbeat_at`` from a thread of its own; it is *live*
    while that is younger than ``settings.worker_lease``. Rows of workers that stopped or
    expired are kept for the dashboard's Workers page and pruned by housekeeping after a day."""

    __tablename__ = "geneva_drive_workers"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    #: ``celery@host/pid`` (a Celery pool process) or ``embedded@host/pid``.
    name: Mapped[str] = mapped_column(String(255), nullable=False)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    #: ``celery`` or ``embedded``.
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    #: The queues it consumes, comma-separated ("" for an embedded worker: it reads the table).
    queues: Mapped[str] = mapped_column(String(1024), nullable=False, default="", server_default="")
    #: GENEVA_CODE_VERSION, or a digest of the registered workflow classes' step plans.
    code_version: Mapped[str] = mapped_column(String(64), nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)
    #: Set by a clean stop, after its steps finished or were handed back.
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    @property
    def queue_list(self) -> list[str]:
        return [name for name in self.queues.split(",") if name]


class ScheduleRow(Base):
    """One recurring workflow (engine/recurrence.py defines it, engine/schedules.py fires it):
    defined in code (``source`` ``code``, written from the registered classes) or at run time
    (``runtime``, ``Schedule.create``). ``next_fire_at`` is the next tick; each tick is fired
    under this row's lock, exactly once. A code schedule removed from the code gets
    ``disabled_at`` and never fires; it is kept, and shown."""

    __tablename__ = "geneva_drive_schedules"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), nullable=False, unique=True)
    workflow_type: Mapped[str] = mapped_column(String(255), nullable=False)
    #: A runtime schedule's hero (a code schedule computes its hero at each tick).
    hero_type: Mapped[str | None] = mapped_column(String(255))
    hero_id: Mapped[str | None] = mapped_column(String(64))
    #: Exactly one of the two: a cron expression, or an interval in seconds.
    cron: Mapped[str | None] = mapped_column(String(255))
    every_seconds: Mapped[float | None] = mapped_column(Double)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False, default="UTC")
    catch_up: Mapped[str] = mapped_column(String(16), nullable=False, default="latest")
    catch_up_window_seconds: Mapped[float] = mapped_column(Double, nullable=False, default=86400.0)
    overlap: Mapped[str] = mapped_column(String(16), nullable=False, default="skip")
    paused: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    #: ``code`` or ``runtime``.
    source: Mapped[str] = mapped_column(String(16), nullable=False)
    #: The next tick (UTC); ticks of ``every=`` fall at ``anchor_at + k·every``.
    next_fire_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, index=True)
    anchor_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: The last tick handled (fired, skipped or missed) and when a workflow was last created.
    last_tick_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_fired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_workflow_id: Mapped[int | None] = mapped_column(BigId)
    #: Ticks by what became of them: a workflow created, skipped (the previous run still
    #: going, or its creation refused), missed (every dispatcher down; ``catch_up``).
    ticks_created: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    ticks_skipped: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    ticks_missed: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    last_skipped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_skip_reason: Mapped[str | None] = mapped_column(String(255))
    last_missed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        UTCDateTime(), nullable=False, default=utcnow, onupdate=utcnow
    )
    __table_args__ = (MYSQL_TABLE_OPTIONS,)


class Lease(Base):
    """A named lease one process holds at a time (engine/liveness.py ``hold_lease``): keeps two
    housekeeping runs, started by two dispatchers or beats, from overlapping. A holder that
    died lets it lapse at ``expires_at``."""

    __tablename__ = "geneva_drive_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    __table_args__ = (MYSQL_TABLE_OPTIONS,)


class DashboardSessionGeneration(Base):
    """Per dashboard login name: the generation of its sessions. Logging out bumps it, which
    ends every session of that name issued before (each session cookie carries the generation
    it was issued under), so a cookie copied before the logout no longer acts."""

    __tablename__ = "geneva_drive_dashboard_sessions"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    generation: Mapped[int] = mapped_column(
        BigInteger, nullable=False, default=0, server_default="0"
    )
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, nullable=False)


class WorkflowCount(Base):
    """Workflows per (class, state), kept by every write of a workflow row (docs/MANUAL.md, "The dashboard").

    The overview and ``/metrics`` read these rows instead of counting the workflows table,
    whose size is the whole history kept. Each (type, state) is split over
    ``geneva_drive.counts.SHARDS`` rows: a transaction adds its changes to one shard picked at
    random, so concurrent transitions rarely wait for the same row lock. The count of a
    (type, state) is the sum of its shards (one shard alone may be negative). Written only by
    :mod:`geneva_drive.counts`.
    """

    __tablename__ = "geneva_drive_workflow_counts"

    type: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(32), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")

    __table_args__ = (MYSQL_TABLE_OPTIONS,)

    def __repr__(self) -> str:
        return f"<WorkflowCount {self.type}/{self.state}#{self.shard} {self.count}>"


class _ExecutionCounts:
    """The columns of a rollup of finished step executions (:mod:`geneva_drive.rollups`)."""

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    #: Whole minutes since 1970-01-01 UTC: the minute counted, or the first of the hour.
    minute: Mapped[int] = mapped_column(BigInteger, nullable=False, index=True)
    type: Mapped[str] = mapped_column(String(255), nullable=False)
    step_name: Mapped[str] = mapped_column(String(255), nullable=False)
    #: ``completed``, ``failed`` or ``reattempted`` (``geneva_drive.rollups.KIND``).
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    #: The failed executions' error class; ``""`` for the other kinds.
    error_class_name: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    last_finished_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    #: The newest execution counted here (the failures page shows its message while it is kept).
    last_execution_id: Mapped[int] = mapped_column(BigInteger, nullable=False)

    __table_args__ = (MYSQL_TABLE_OPTIONS,)


class ExecutionMinute(_ExecutionCounts, Base):
    """Step executions that finished in one minute, per (class, step, kind, error class):
     what the charts and the failures page read instead of every execution of their window
    . Rolled up by housekeeping from the executions of settled minutes and written
     only by :mod:`geneva_drive.rollups`; minutes not rolled up yet are read from the
     executions. ``minute`` is whole minutes since 1970-01-01 UTC."""

    __tablename__ = "geneva_drive_execution_minutes"


class ExecutionHour(_ExecutionCounts, Base):
    """The same counts per whole hour, summed from :class:`ExecutionMinute` once every minute
    of the hour is rolled up: the failures page's 7 days and the day chart read 24 or 168 rows
    per group instead of 1,440 or 10,080. ``minute`` is the hour's first minute."""

    __tablename__ = "geneva_drive_execution_hours"


class RollupMark(Base):
    """How far a rollup has gone: every minute in ``[from_minute, until_minute)`` is rolled up
    (``geneva_drive.rollups``). One row per rollup, locked by the pass that moves it, so two
    housekeeping passes never count a minute twice."""

    __tablename__ = "geneva_drive_rollup_marks"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    from_minute: Mapped[int | None] = mapped_column(BigInteger)
    until_minute: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (MYSQL_TABLE_OPTIONS,)


# --- MariaDB and MySQL: no partial indexes -----------------------------------------------------


@dataclass(frozen=True)
class MySQLIndexForm:
    """The MariaDB/MySQL form of a partial index of the models.

    A unique partial index becomes a STORED generated column holding the index key while the
    row is in the indexed state and NULL otherwise, under a plain unique index of that one
    column (NULLs are distinct in a unique index, so only rows in that state collide), as the
    gem does. One column, not the key columns plus a 1-or-NULL marker: InnoDB's duplicate
    check S-locks the index entries next to the new key, and with a marker the entry a row
    leaves behind (key, NULL) sits right beside the active keys of the neighbouring workflow.
    Measured under B3's burst on MariaDB: a worker finishing workflow N (its execution's
    entry moving to (N, NULL)) and one inserting the next execution of workflow N-1 (checking
    for a duplicate beside N's entries) deadlocked. With one column the inactive entries all
    sit in the NULL range, where no duplicate check looks. A non-unique partial index becomes
    a composite index led by the state column. Each keeps the partial index's name.
    """

    table: str
    name: str
    columns: tuple[str, ...]
    unique: bool
    #: (column, SQL type, expression) of the STORED generated column the index is on.
    generated: tuple[str, str, str] | None = None

    def ddl(self) -> list[str]:
        statements = []
        if self.generated is not None:
            column, sql_type, expression = self.generated
            statements.append(
                f"ALTER TABLE `{self.table}` ADD COLUMN `{column}` {sql_type} "
                f"GENERATED ALWAYS AS ({expression}) STORED"
            )
        unique = "UNIQUE " if self.unique else ""
        columns = ", ".join(f"`{c}`" for c in self.columns)
        statements.append(f"CREATE {unique}INDEX `{self.name}` ON `{self.table}` ({columns})")
        return statements


MYSQL_FORMS = (
    MySQLIndexForm(
        "geneva_drive_workflows",
        "index_geneva_drive_workflows_unique_ongoing",
        ("ongoing_unique_key",),
        unique=True,
        # Each part length-prefixed, so that no two different (type, hero_type, hero_id)
        # give one key (a plain separator could also appear inside a part). A NULL hero part
        # makes the key NULL: such workflows never collide, as on PostgreSQL.
        generated=(
            "ongoing_unique_key",
            "VARCHAR(600)",
            "CASE WHEN `state` NOT IN ('finished', 'canceled') AND `allow_multiple` = 0 "
            "THEN CONCAT(CHAR_LENGTH(`type`), ':', `type`, CHAR_LENGTH(`hero_type`), ':', "
            "`hero_type`, ':', `hero_id`) END",
        ),
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_one_active",
        ("active_unique_key",),
        unique=True,
        generated=(
            "active_unique_key",
            "BIGINT",
            "CASE WHEN `state` IN ('scheduled', 'in_progress') THEN `workflow_id` END",
        ),
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_in_progress_started_at",
        ("state", "started_at"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_waiting_timeout",
        ("state", "timeout_at"),
        unique=False,
    ),
    # Led by the column of the condition: the NULLs of every execution that never timed out
    # sit in one range that the filter's ``IS NOT NULL`` skips.
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_timed_out",
        ("timed_out_at", "workflow_id"),
        unique=False,
    ),
    # Migration 0007. InnoDB appends the primary key to each, so (state, X) gives (X, id) order
    # within one state.
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_failed_at",
        ("state", "failed_at"),
        unique=False,
    ),
    # Migration 0008: led by the slot column, so the NULLs of unlimited executions sit in one
    # range that no limit query reads.
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_limit_slot",
        ("limit_slot", "state"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_step_limit_slot",
        ("step_limit_slot", "state"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_rate_slot",
        ("rate_slot", "started_at"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_step_executions",
        "index_geneva_drive_step_executions_deferred_on",
        ("deferred_on", "state"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_signals",
        "index_geneva_drive_signals_pending",
        ("state", "created_at"),
        unique=False,
    ),
    MySQLIndexForm(
        "geneva_drive_workflows",
        "index_geneva_drive_workflows_terminal_transitioned",
        ("state", "transitioned_at"),
        unique=False,
    ),
)
_MYSQL_INDEX_NAMES = frozenset(form.name for form in MYSQL_FORMS)
_MYSQL_COLUMNS = frozenset(
    (form.table, form.generated[0]) for form in MYSQL_FORMS if form.generated is not None
)


@event.listens_for(Base.metadata, "before_create")
def _name_the_mysql_collation(_target: MetaData, connection: Connection, **kw: Any) -> None:
    """``create_all`` on MariaDB/MySQL: the engine's tables get this server's collation."""
    dialect_for(connection).before_create(connection, kw.get("tables", ()))


@event.listens_for(Base.metadata, "after_create")
def _create_mysql_forms(_target: MetaData, connection: Connection, **kw: Any) -> None:
    """``create_all`` on MariaDB/MySQL: the generated columns and indexes of MYSQL_FORMS."""
    if dialect_for(connection).partial_indexes:
        return
    created = {table.name for table in kw.get("tables", ())}
    for form in MYSQL_FORMS:
        if form.table in created:
            for statement in form.ddl():
                connection.exec_driver_sql(statement)


def autogenerate_filter(dialect: Dialect) -> Any:
    """Alembic's ``include_object`` for the engine's schema on ``dialect``'s database.

    Alembic's autogenerate ignores ``Index.ddl_if``: it would offer to create the partial
    indexes on MariaDB/MySQL, and to drop the MYSQL_FORMS' columns and indexes there. Those
    are the same guarantees in each backend's form, so the comparison leaves them out;
    everything else is compared as usual (migrations/env.py uses it for ``flask db migrate``,
    tests/test_migrations.py for its check).
    """
    found = dialect_for(dialect)

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, _compare_to: Any
    ) -> bool:
        if type_ == "index" and not reflected:
            condition = getattr(obj, "_ddl_if", None)
            if condition is None or condition.dialect is None:
                return True
            return found.ddl_applies(dialect, condition.dialect)
        if found.partial_indexes or not reflected:
            return True
        if type_ in ("index", "unique_constraint"):
            return name not in _MYSQL_INDEX_NAMES
        if type_ == "column":
            table = getattr(getattr(obj, "table", None), "name", None)
            return (table, name) not in _MYSQL_COLUMNS
        return True

    return include_object


OUTCOMES = frozenset(o.value for o in Outcome)

__all__ = [
    "MYSQL_FORMS",
    "Base",
    "DashboardSessionGeneration",
    "JSONType",
    "Lease",
    "LimitSlot",
    "OperatorAction",
    "ScheduleRow",
    "Signal",
    "StepExecution",
    "UTCDateTime",
    "Worker",
    "Workflow",
    "WorkflowCount",
    "autogenerate_filter",
    "func",
    "utcnow",
]
