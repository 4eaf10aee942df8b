"""Typed SQLAlchemy models: the schema of reference/engine-core.md §1.

``Base`` is the engine's ``DeclarativeBase``; its metadata is what Flask-SQLAlchemy and
Flask-Migrate are bound to, and what the test fixture creates. Applications may map their own
hero models on it or on any other base.

The workflow model itself (``Workflow``) lives in :mod:`geneva_drive.workflow` because workflow
classes are single-table-inheritance subclasses of it; it is re-exported here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from geneva_drive.config import settings
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
    }
)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no zone, so values are stored as naive UTC
    and come back tagged as UTC. Naive values handed in are taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JSONType(TypeDecorator[Any]):
    """JSONB on PostgreSQL, JSON-in-TEXT elsewhere (SPEC §1.1)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
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
        ),
        Index(
            "index_geneva_drive_step_executions_in_progress_started_at",
            "started_at",
            postgresql_where=text(_IN_PROGRESS),
            sqlite_where=text(_IN_PROGRESS),
        ),
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
    """An external event delivered to one workflow (reference signals §2.2)."""

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

    def __repr__(self) -> str:
        return f"<OperatorAction id={self.id} {self.actor} {self.action} wf={self.workflow_id}>"


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


OUTCOMES = frozenset(o.value for o in Outcome)

__all__ = [
    "Base",
    "DashboardSessionGeneration",
    "JSONType",
    "OperatorAction",
    "Signal",
    "StepExecution",
    "UTCDateTime",
    "func",
    "utcnow",
]
