"""The ``Workflow`` model and its class-level DSL.

Workflow classes are single-table-inheritance subclasses of :class:`Workflow`; the stored
``type`` is the class's ``workflow_name`` (the class name unless set). Steps, conditions,
policies and job options are collected and validated when the class is defined; a class that
fails validation raises and is not registered, so it can be defined again.

Flow control (``cancel()``, ``pause()``, ``skip()``, ``reattempt()``, ``finish()``,
``suspend()``) ends the step when called inside one; outside a step ``cancel()``, ``pause()``
and ``skip()`` are operator actions (:mod:`geneva_drive.operations`).
"""

from __future__ import annotations

import builtins
import contextvars
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Index,
    Integer,
    Select,
    String,
    func,
    inspect,
    or_,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import (
    Mapped,
    Session,
    mapped_column,
    object_session,
    relationship,
    scoped_session,
)
from sqlalchemy.orm.exc import UnmappedInstanceError

from geneva_drive import (
    children,
    db,
    explain,
    operations,
    persistence,
    registry,
    scheduling,
    signals,
    tracing,
)
from geneva_drive.errors import (
    DuplicateWorkflowError,
    InvalidInputError,
    InvalidStateError,
    NoOngoingWorkflowError,
    StepConfigurationError,
    UsageError,
)
from geneva_drive.flow_control import FlowAction, FlowInterrupt
from geneva_drive.job_options import to_json_options, validate_job_options
from geneva_drive.limits import ConcurrencyLimit, check_class_limit, check_key_methods
from geneva_drive.models import (
    MYSQL_TABLE_OPTIONS,
    PARTIAL_INDEX_DIALECTS,
    TERMINAL_WORKFLOW_PREDICATE,
    Base,
    BigId,
    JSONType,
    Signal,
    StepExecution,
    TimestampMixin,
    UTCDateTime,
)
from geneva_drive.policies import ExceptionPolicy
from geneva_drive.registry import (
    hero_class,
    register_hero_class,
    registered_workflows,
    workflow_class,
)
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    TERMINAL_WORKFLOW_STATES,
    WorkflowState,
    is_ongoing,
)
from geneva_drive.steps import StepCollection, StepDefinition, StepSpec, build_definition
from geneva_drive.transitions import new_workflow_columns, point_at

if TYPE_CHECKING:
    from geneva_drive.models import OperatorAction  # noqa: F401

_ONGOING_UNIQUE = "state NOT IN ('finished', 'canceled') AND allow_multiple = false"
_ONGOING_UNIQUE_SQLITE = "state NOT IN ('finished', 'canceled') AND allow_multiple = 0"

# The workflow whose step body (or exception handler) runs in this context. Flow-control calls
# on it end the step instead of acting as operator actions.
_executing: contextvars.ContextVar[Any] = contextvars.ContextVar("geneva_executing", default=None)


@contextmanager
def executing(workflow: Workflow) -> Iterator[None]:
    token = _executing.set(workflow)
    try:
        yield
    finally:
        _executing.reset(token)


class _StepsDescriptor:
    """``Klass.steps`` and ``instance.steps``: the class's ordered StepCollection (cached)."""

    def __get__(self, instance: Any, owner: type[Workflow]) -> StepCollection:
        cached = owner.__dict__.get("_steps_cache")
        if cached is None:
            cached = StepCollection(list(owner._step_definitions), owner._step_aliases)
            owner._steps_cache = cached
        return cached


#: A session as callers hold it: a ``Session``, or a ``scoped_session`` of any session class
#: (Flask-SQLAlchemy's ``db.session`` is a ``scoped_session`` of its own ``Session`` subclass).
AnySession = Session | scoped_session[Any]
#: A workflow class passed to ``start_child`` (the child has that class).
W = TypeVar("W", bound="Workflow")


class Workflow(TimestampMixin, Base):
    """Base class of every workflow. Subclass it and decorate methods with ``@step``."""

    __tablename__ = "geneva_drive_workflows"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    type: Mapped[str] = mapped_column(String(255), nullable=False)
    hero_type: Mapped[str | None] = mapped_column(String(255))
    # Text form of the hero's primary key, so int and UUID heroes share one column.
    hero_id: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(
        String(32), nullable=False, default=WorkflowState.READY, server_default=WorkflowState.READY
    )
    current_step_name: Mapped[str | None] = mapped_column(String(255))
    next_step_name: Mapped[str | None] = mapped_column(String(255))
    allow_multiple: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=False, server_default=text("false")
    )
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    transitioned_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Child workflows (docs/MANUAL.md, "Fan-out and join: child workflows", engine/children.py, migration 0009). ``parent_id`` names the
    # workflow whose step started this one; SET NULL, so housekeeping may delete an old parent
    # before its children. ``children_open`` counts this workflow's children that have not ended
    # yet and ``children_canceled`` those that ended canceled since the last join: each child's
    # end changes them by one under this row's lock, so a join never rescans the children.
    parent_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("geneva_drive_workflows.id", ondelete="SET NULL")
    )
    children_open: Mapped[int] = mapped_column(
        Integer, nullable=False, default=0, server_default="0"
    )
    children_canceled: Mapped[int] = mapped_column(
        Integer, nullable=False, default=0, server_default="0"
    )

    # Read-only collections: the engine writes executions and signals through their
    # workflow_id (their own ``workflow`` many-to-one stays writable), and the database's ON
    # DELETE CASCADE removes them with the workflow. A writable one-to-many would make every
    # flush walk every Workflow subclass mapper for these two properties (SQLAlchemy's unit of
    # work iterates the parent's mapper hierarchy per dependency), a cost that grows with the
    # number of workflow classes an application defines.
    step_executions: Mapped[list[StepExecution]] = relationship(
        viewonly=True,
        order_by="(StepExecution.created_at, StepExecution.id)",
        lazy="select",
    )
    signals: Mapped[list[Signal]] = relationship(
        viewonly=True,
        order_by="(Signal.created_at, Signal.id)",
        lazy="select",
    )

    # Read-only too: start_child() writes parent_id (engine/children.py).
    parent: Mapped[Workflow | None] = relationship(
        "Workflow", remote_side="Workflow.id", viewonly=True, lazy="select"
    )
    children: Mapped[list[Workflow]] = relationship(
        "Workflow", viewonly=True, order_by="Workflow.id", lazy="select"
    )

    __mapper_args__ = {
        "polymorphic_on": "type",
        "polymorphic_identity": "Workflow",
    }
    __table_args__ = (
        Index("index_geneva_drive_workflows_on_type", "type", "state", "id"),
        Index("index_geneva_drive_workflows_on_state", "state", "id"),
        Index("index_geneva_drive_workflows_on_hero", "hero_type", "hero_id"),
        Index("index_geneva_drive_workflows_on_updated_at", "updated_at", "id"),
        # The dashboard's step filter (migration 0002): no page view scans the table.
        Index("index_geneva_drive_workflows_on_next_step", "next_step_name", "id"),
        # The hero id filter without a type (/workflows?hero_id=, bulk scope=all), migration 0006.
        Index("index_geneva_drive_workflows_on_hero_id", "hero_id", "id"),
        # A parent's children in id order: wf.children, /workflows?parent=, cancel_children
        # (migration 0009).
        Index("index_geneva_drive_workflows_on_parent", "parent_id", "id"),
        Index(
            "index_geneva_drive_workflows_unique_ongoing",
            "type",
            "hero_type",
            "hero_id",
            unique=True,
            postgresql_where=text(_ONGOING_UNIQUE),
            sqlite_where=text(_ONGOING_UNIQUE_SQLITE),
            # MariaDB/MySQL: a generated column under a plain unique index (models.MYSQL_FORMS).
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # Housekeeping's cleanup candidates (migration 0007): old finished/canceled workflows
        # in time order, so a pass with nothing to delete reads an empty index range.
        # MariaDB/MySQL: (state, transitioned_at) from models.MYSQL_FORMS. SQLite: a full
        # index, as its planner without statistics would not pick the partial one
        # (housekeeping._old).
        Index(
            "index_geneva_drive_workflows_terminal_transitioned",
            "transitioned_at",
            "id",
            postgresql_where=text(TERMINAL_WORKFLOW_PREDICATE),
        ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS),  # type: ignore[arg-type]  # a tuple, as documented
        # SQLite would otherwise reuse the ids of workflows housekeeping deleted, and the audit
        # log (no foreign key, it outlives workflows) would show old actions on a new workflow.
        {"sqlite_autoincrement": True, **MYSQL_TABLE_OPTIONS},
    )

    # --- class-level DSL (declared in subclasses; collected by __init_subclass__) -------------
    workflow_name: ClassVar[str] = "Workflow"
    cancel_if: ClassVar[Any] = ()
    exception_policies: ClassVar[Any] = ()
    may_proceed_without_hero: ClassVar[bool] = False
    #: Canceling a workflow of this class cancels its ongoing children in the same transaction
    #: (docs/MANUAL.md, "Fan-out and join: child workflows").
    cancel_children: ClassVar[bool] = False
    #: A ``ConcurrencyLimit`` covering each step of the class (docs/MANUAL.md, "Concurrency and rate limits"); inherited.
    concurrency_limit: ClassVar[ConcurrencyLimit | None] = None
    #: A ``geneva_drive.Schedule``: the dispatcher creates a workflow of this class at each of
    #: its ticks (docs/MANUAL.md, "Recurring work"). Not inherited: a subclass declares its own.
    schedule: ClassVar[Any] = None

    _step_definitions: ClassVar[list[StepDefinition]] = []
    _cancel_conditions: ClassVar[list[Any]] = []
    _exception_policies: ClassVar[list[ExceptionPolicy]] = []
    _class_step_job_options: ClassVar[dict[str, Any]] = {}
    _steps_cache: ClassVar[StepCollection | None] = None
    #: ``{old_name: new_name}`` from ``renamed_step`` lines (inherited, like the steps).
    _step_aliases: ClassVar[dict[str, str]] = {}

    steps: ClassVar[StepCollection] = _StepsDescriptor()  # type: ignore[assignment]

    #: The signal attached to the running step (None for steps without ``wait_for``).
    received_signal: Any = None
    #: True inside a step body that runs because its wait for a signal timed out
    #: (``on_timeout="run"``, docs/MANUAL.md, "Time-bounded waits"); ``received_signal`` is None then.
    wait_timed_out: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        own = cls.__dict__
        if own.get("__abstract__"):
            super().__init_subclass__(**kwargs)
            return
        name = own.get("workflow_name") or cls.__name__
        cls.workflow_name = str(name)
        _refuse_shadowed_columns(cls)
        _assemble_dsl(cls)
        args = dict(own.get("__mapper_args__", {}))
        args.setdefault("polymorphic_identity", cls.workflow_name)
        cls.__mapper_args__ = args
        with warnings.catch_warnings():
            # Redefining a workflow class (tests, reloads) re-points its identity; that is intended.
            warnings.filterwarnings("ignore", message=".*Reassigning polymorphic association.*")
            warnings.filterwarnings("ignore", message=".*This declarative base already contains.*")
            super().__init_subclass__(**kwargs)
        registry.register_workflow(cls)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id} state={self.state} next={self.next_step_name!r}>"
        )

    # --- class helpers ---------------------------------------------------------------------------

    @classmethod
    def class_step_job_options(cls) -> dict[str, Any]:
        return dict(cls._class_step_job_options)

    @classmethod
    def add_step(cls, name: str, fn: Callable[..., Any] | str, **options: Any) -> StepDefinition:
        """Register a step after the class body (for steps generated in a loop)."""
        if cls is Workflow:
            raise StepConfigurationError(
                "add_step() is called on a Workflow subclass, not on Workflow itself"
            )
        resumable = bool(options.pop("resumable", False))
        spec = StepSpec(fn=None, options=options, resumable=resumable)
        body: Callable[..., Any] | None
        method_name: str | None = None
        if isinstance(fn, str):
            method_name = fn
            if not callable(getattr(cls, fn, None)):
                raise StepConfigurationError(
                    f"Step '{name}' of {cls.__name__} names method '{fn}', which {cls.__name__} "
                    "does not define"
                )
            body = getattr(cls, fn)
        else:
            body = fn
        definition = _register(cls, str(name), body, spec)
        definition.method_name = method_name
        check_key_methods(cls)
        return definition

    @classmethod
    def resolve_exception_policy(cls, error: BaseException) -> ExceptionPolicy | None:
        policies = cls._exception_policies
        specific = next((p for p in policies if p.is_specific and p.captures(error)), None)
        if specific is not None:
            return specific
        return next((p for p in policies if p.is_blanket), None)

    # --- creation ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        hero: Any = None,
        session: AnySession | None = None,
        allow_multiple: bool = False,
        step_job_options: dict[str, Any] | None = None,
        *,
        _parent: Workflow | None = None,
        _metadata: dict[str, Any] | None = None,
    ) -> Self:
        """Insert the workflow and schedule its first step (flushed, not committed).

        Raises DuplicateWorkflowError when an ongoing workflow of this class already exists for
        ``hero`` (pass ``allow_multiple=True`` to allow several). ``_parent`` is
        ``start_child``'s (engine/children.py); ``_metadata`` goes into the row's metadata with
        the INSERT (a schedule's name and tick, engine/schedules.py).
        """
        if cls is Workflow or not registry.is_registered(cls):
            raise InvalidInputError(
                f"{cls.__name__}.create(): create a registered Workflow subclass, not {cls.__name__}"
            )
        session = _resolve_session(session, hero)
        workflow = cls(**new_workflow_columns(), allow_multiple=bool(allow_multiple))
        if _parent is not None:
            workflow.parent_id = _parent.id
        if hero is not None:
            _hero_identity_ready(session, hero)
        workflow.hero = hero
        if step_job_options:
            workflow.step_job_options = step_job_options
        if _metadata:
            workflow.metadata_ = {**(workflow.metadata_ or {}), **_metadata}
        # The caller's trace context, when a span is current: every step's span is its child
        # (docs/MANUAL.md, "Tracing"); a step's start_child() stores that step's span.
        traced = tracing.with_creator(workflow.metadata_)
        if traced is not None:
            workflow.metadata_ = traced
        if not allow_multiple:
            existing = session.scalars(
                select(Workflow.id)
                .where(
                    Workflow.type == cls.workflow_name,
                    Workflow.hero_type.is_(None)
                    if workflow.hero_type is None
                    else Workflow.hero_type == workflow.hero_type,
                    Workflow.hero_id.is_(None)
                    if workflow.hero_id is None
                    else Workflow.hero_id == workflow.hero_id,
                    Workflow.state.not_in(list(TERMINAL_WORKFLOW_STATES)),
                    Workflow.allow_multiple.is_(False),
                )
                .limit(1)
            ).first()
            if existing is not None:
                raise _duplicate_error(cls, workflow, existing)
        first = cls.steps.next_after(None)
        if first is not None:
            # Written with the INSERT, so scheduling the first step only inserts its execution.
            point_at(workflow, first.name)
        if allow_multiple:
            # No unique key can collide (the one-ongoing-per-hero index leaves these rows out),
            # so no savepoint: two round trips fewer per workflow on the servers, which is
            # what a step starting 10,000 children pays 10,000 times.
            persistence.insert_new(session, workflow)
        else:
            try:
                # Inserted inside the savepoint: on a unique-index violation (a race) its
                # rollback leaves the caller's transaction usable, and the object never joined
                # the session. One Core INSERT, not the unit of work (engine/persistence.py).
                with session.begin_nested():
                    persistence.insert_new(session, workflow)
            except IntegrityError as exc:
                raise _duplicate_error(cls, workflow, None) from exc
        if first is None:
            scheduling.finish_workflow(session, workflow)
        else:
            scheduling.create_step_execution(session, workflow, first, first.wait, fresh=True)
        return workflow

    # --- queries --------------------------------------------------------------------------

    @classmethod
    def query(cls) -> Select[Any]:
        """``select(cls)``; for a subclass it is filtered to that class's type."""
        return select(cls)

    @classmethod
    def ongoing(cls, session: AnySession) -> list[Self]:
        return list(
            session.scalars(cls.query().where(cls.state.not_in(list(TERMINAL_WORKFLOW_STATES))))
        )

    @classmethod
    def in_state(cls, session: AnySession, state: str) -> list[Self]:
        return list(session.scalars(cls.query().where(cls.state == str(state)).order_by(cls.id)))

    @classmethod
    def paused(cls, session: AnySession) -> list[Self]:
        return cls.in_state(session, WorkflowState.PAUSED)

    @classmethod
    def for_hero(cls, session: AnySession, hero: Any) -> list[Self]:
        hero_type, hero_id = hero_key(hero)
        return list(
            session.scalars(
                cls.query()
                .where(cls.hero_type == hero_type, cls.hero_id == hero_id)
                .order_by(cls.id)
            )
        )

    @classmethod
    def ongoing_for_hero(cls, session: AnySession, hero: Any) -> Self:
        """The one ongoing workflow of this class for ``hero`` (a mapped object, or a
        ``(hero_type, hero_id)`` pair as a webhook carries it).

        Raises :class:`NoOngoingWorkflowError` when there is none, and ``InvalidStateError``
        when there are several (``allow_multiple``): a signal then needs the workflow's id.
        """
        hero_type, hero_id = _hero_pair(hero)
        found: list[Self] = list(
            session.scalars(
                cls.query()
                .where(
                    cls.hero_type == hero_type,
                    cls.hero_id == hero_id,
                    cls.state.not_in(list(TERMINAL_WORKFLOW_STATES)),
                )
                .order_by(cls.id)
                .limit(2)
            )
        )
        if not found:
            raise NoOngoingWorkflowError(
                f"No ongoing {cls.__name__} for {hero_type} {hero_id}: it finished, was "
                "canceled or never started. Check the hero id, or start one with "
                f"{cls.__name__}.create()."
            )
        if len(found) > 1:
            raise InvalidStateError(
                f"{hero_type} {hero_id} has more than one ongoing {cls.__name__} "
                f"(#{found[0].id}, #{found[1].id}, allow_multiple): signal one by its id."
            )
        return found[0]

    @classmethod
    def signal_hero(
        cls,
        session: AnySession,
        hero: Any,
        name: str,
        payload: Any = None,
        *,
        idempotency_key: Any = None,
    ) -> Signal:
        """Deliver ``name`` to the ongoing workflow of this class for ``hero``: a webhook's
        shape (docs/MANUAL.md, "Automating operations"). ``hero`` is a mapped object or a
        ``(hero_type, hero_id)`` pair. Safe to retry with an ``idempotency_key``."""
        workflow = cls.ongoing_for_hero(session, hero)
        return workflow.signal(name, payload, idempotency_key=idempotency_key)

    @classmethod
    def removed_steps_in_flight(cls, session: AnySession) -> dict[str, int]:
        """``{gravestone_name: executions}`` for ongoing workflows of this class (the drain view)."""
        names = [s.name for s in cls.steps.removed]
        if not names:
            return {}
        return _executions_named(session, cls, names)

    @classmethod
    def renamed_steps_in_flight(cls, session: AnySession) -> dict[str, int]:
        """``{old_name: workflows}``: ongoing workflows of this class that still refer to a
        renamed step's old name (an execution under it, or their next step). 0 for an old
        name: the ``renamed_step`` line can go."""
        counts: dict[str, int] = {}
        ongoing = cls.state.not_in(list(TERMINAL_WORKFLOW_STATES))
        for old in cls.steps.renamed:
            under_old = (
                select(StepExecution.id)
                .where(StepExecution.workflow_id == cls.id, StepExecution.step_name == old)
                .exists()
            )
            counts[old] = int(
                session.scalar(
                    select(func.count())
                    .select_from(cls)
                    .where(ongoing, or_(cls.next_step_name == old, under_old))
                )
                or 0
            )
        return counts

    # --- hero ---------------------------------------------------------------------------------

    @property
    def hero(self) -> Any:
        cached = self.__dict__.get("_hero_cache", _MISSING)
        key = (self.hero_type, self.hero_id)
        if cached is not _MISSING and cached[0] == key and _still_loaded(cached[1]):
            return cached[1]
        value = load_hero(object_session(self), self.hero_type, self.hero_id)
        self.__dict__["_hero_cache"] = (key, value)
        return value

    @hero.setter
    def hero(self, value: Any) -> None:
        if value is None:
            self.hero_type, self.hero_id = None, None
        else:
            self.hero_type, self.hero_id = hero_key(value)
        self.__dict__["_hero_cache"] = ((self.hero_type, self.hero_id), value)

    # --- state helpers --------------------------------------------------------------------

    @property
    def is_ongoing(self) -> bool:
        return is_ongoing(self.state)

    @property
    def session(self) -> Session:
        return scheduling.session_of(self)

    @property
    def current_execution(self) -> StepExecution | None:
        session = object_session(self)
        if session is None or self.id is None:
            return None
        return scheduling.current_execution(session, self)

    @property
    def execution_history(self) -> list[StepExecution]:
        session = self.session
        return list(
            session.scalars(
                select(StepExecution)
                .where(StepExecution.workflow_id == self.id)
                .order_by(StepExecution.created_at, StepExecution.id)
            )
        )

    @property
    def previous_step_name(self) -> str | None:
        ref = scheduling.reference_step_name(self)
        if ref is not None:
            prev = self.steps.previous_before(ref)
            return prev.name if prev is not None else None
        if self.state == WorkflowState.FINISHED:
            last = self.steps.last()
            return last.name if last is not None else None
        return None

    @property
    def step_job_options(self) -> dict[str, Any]:
        stored = (self.metadata_ or {}).get("step_job_options")
        return dict(stored) if stored else {}

    @step_job_options.setter
    def step_job_options(self, options: dict[str, Any] | None) -> None:
        metadata = dict(self.metadata_ or {})
        if not options:
            metadata["step_job_options"] = None
        else:
            validated = validate_job_options(options, f"{type(self).__name__}.step_job_options")
            metadata["step_job_options"] = to_json_options(validated)
        self.metadata_ = metadata

    def why_waiting(self, now: datetime | None = None) -> str:
        """One line saying why this workflow is not moving (the dashboard's why line)."""
        return explain.why_waiting(self, now=now)

    # --- hooks around every step body (override in a subclass) ------------------------------

    def before_step_execution(self, execution: StepExecution) -> None:
        """Runs before each step body (outside the locks)."""

    def around_step_execution(self, execution: StepExecution, call: Callable[[], Any]) -> Any:
        """Wraps each step body; an override must call ``call()`` and return its result."""
        return call()

    def after_step_execution(self, execution: StepExecution) -> None:
        """Runs after each step body, whatever its outcome."""

    # --- flow control ---------------------------------------------------------------------

    def _in_step(self) -> bool:
        running = _executing.get()
        return running is not None and (running is self or running.id == self.id)

    def cancel(self) -> None:
        """In a step: cancel the workflow. Outside: operator cancel (ready or paused)."""
        if self._in_step():
            raise FlowInterrupt(FlowAction.CANCEL)
        operations.cancel(self)

    def pause(self) -> None:
        """In a step: pause the workflow. Outside: operator pause (ready only)."""
        if self._in_step():
            raise FlowInterrupt(FlowAction.PAUSE)
        operations.pause(self)

    def skip(self) -> None:
        """In a step: skip it. Outside: operator skip of the current step (ready or paused)."""
        if self._in_step():
            raise FlowInterrupt(FlowAction.SKIP)
        operations.skip(self)

    def reattempt(self, wait: timedelta | float | None = None, rewind: bool = False) -> None:
        """In a step: run it again (after ``wait``; ``rewind`` restarts a resumable cursor).

        Outside a step (operator): a paused workflow is resumed, which retries its step; a
        ready workflow runs its current step again now.
        """
        if self._in_step():
            if wait is not None and not isinstance(wait, timedelta):
                wait = timedelta(seconds=wait)
            raise FlowInterrupt(FlowAction.REATTEMPT, wait=wait, rewind=rewind)
        operations.reattempt(self)

    def finish(self) -> None:
        """In a step: finish the workflow now, skipping the remaining steps."""
        if not self._in_step():
            raise InvalidStateError(
                f"finish() ends a workflow from inside one of its steps; {type(self).__name__} "
                f"#{self.id} is {self.state}. To stop it from outside, use cancel()."
            )
        raise FlowInterrupt(FlowAction.FINISHED)

    def suspend(self, wait: timedelta | float | None = None) -> None:
        """In a resumable step: end this execution and continue from the cursor after ``wait``."""
        definition = self.steps.named(self.current_step_name)
        if definition is None or not definition.resumable or not self._in_step():
            raise InvalidStateError(
                "suspend() can only be called from inside a resumable_step (it continues from "
                "the persisted cursor)"
            )
        if wait is not None and not isinstance(wait, timedelta):
            wait = timedelta(seconds=wait)
        raise FlowInterrupt(FlowAction.SUSPEND, wait=wait)

    def resume(self) -> StepExecution | None:
        """Operator: continue a paused workflow (re-sends its preserved execution or retries)."""
        return operations.resume(self)

    def resume_at(
        self, step_name: str, workflow_class: builtins.type[Workflow] | str | None = None
    ) -> StepExecution:
        """Operator: continue a paused workflow at ``step_name`` (a runnable step).

        ``workflow_class`` moves a workflow whose class no longer exists onto a registered
        class and resumes it at one of that class's steps.
        """
        return operations.resume_at(self, step_name, workflow_class=workflow_class)

    def start_child(self, cls: builtins.type[W], hero: Any = None, **create_options: Any) -> W:
        """In a step: create a child workflow as ``cls.create`` would, in the step's own
        transaction (an attempt that does not succeed starts none), with ``parent_id`` set.
        A later step with ``wait_for_children=True`` waits for it (docs/MANUAL.md, "Fan-out and join: child workflows")."""
        child: W = children.start_child(self, cls, hero=hero, **create_options)
        return child

    def signal(
        self, name: str, payload: Any = None, idempotency_key: Any = None, **unknown: Any
    ) -> Signal:
        """Deliver an external event to this workflow (atomic; safe to retry with a key)."""
        return signals.deliver(
            self, name, payload=payload, idempotency_key=idempotency_key, **unknown
        )


def _executions_named(
    session: AnySession, cls: builtins.type[Workflow], names: list[str]
) -> dict[str, int]:
    """Executions named ``names`` of ongoing workflows of ``cls``, per name.

    From ``cls`` itself, as ongoing() does: the mapper adds its polymorphic filter, so a
    subclass that inherits the gravestone counts too ({} means "drained, delete the line",
    which would strand the subclass's workflows).
    """
    rows = session.execute(
        select(StepExecution.step_name, func.count())
        .select_from(cls)
        .join(StepExecution, StepExecution.workflow_id == cls.id)
        .where(cls.state.not_in(list(TERMINAL_WORKFLOW_STATES)), StepExecution.step_name.in_(names))
        .group_by(StepExecution.step_name)
    )
    return {name: int(count) for name, count in rows}


# An unknown stored ``type`` (the class was deleted) loads as plain Workflow instead of failing.
class _FallbackPolymorphicMap(dict[Any, Any]):
    def __missing__(self, key: Any) -> Any:
        return Workflow.__mapper__


Workflow.__mapper__.polymorphic_map = _FallbackPolymorphicMap(Workflow.__mapper__.polymorphic_map)
_MISSING = object()


def _still_loaded(hero: Any) -> bool:
    """A cached hero is reused only while it is live in a session (not deleted or expired).

    A workflow instance outlives a step in the same session (test helpers, scripts); without
    this check a hero deleted meanwhile would still be returned and its steps would run.
    """
    if hero is None:
        return True
    state = inspect(hero, raiseerr=False)
    if state is None:
        return True
    return bool(state.persistent and not state.expired)


def unregister(name: str) -> None:
    """Forget a workflow class (tests); rows of its type then load as plain Workflow."""
    cls = registry.forget_workflow(name)
    if cls is not None:
        Workflow.__mapper__.polymorphic_map.pop(name, None)


# --- DSL assembly ---------------------------------------------------------------------------


def _assemble_dsl(cls: type[Workflow]) -> None:
    """Collect this class's own DSL declarations over its parent's (copy-on-write)."""
    own = cls.__dict__
    cls._step_definitions = list(cls._step_definitions)
    cls._steps_cache = None

    conditions = list(cls._cancel_conditions)
    if "cancel_if" in own:
        declared = own["cancel_if"]
        conditions.extend(declared if isinstance(declared, list | tuple) else [declared])
    for condition in conditions:
        if not (isinstance(condition, str | bool) or callable(condition)):
            raise StepConfigurationError(
                f"{cls.__name__}.cancel_if has {condition!r}: conditions are method names, callables "
                "taking the workflow, or booleans"
            )
    cls._cancel_conditions = conditions

    policies = list(cls._exception_policies)
    if "exception_policies" in own:
        declared = own["exception_policies"]
        declared = list(declared) if isinstance(declared, list | tuple) else [declared]
        for policy in declared:
            if not isinstance(policy, ExceptionPolicy):
                raise StepConfigurationError(
                    f"{cls.__name__}.exception_policies holds {policy!r}; every entry must be an "
                    "ExceptionPolicy(...)"
                )
        # A subclass's own policies are consulted before its parents'.
        policies = declared + policies
    cls._exception_policies = policies

    job_options = dict(cls._class_step_job_options)
    if "step_job_options" in own:
        job_options.update(
            validate_job_options(own["step_job_options"], f"{cls.__name__}.step_job_options")
        )
        # The instance-level property of the same name (per-workflow options) stays reachable.
        delattr(cls, "step_job_options")
    cls._class_step_job_options = job_options

    if "may_proceed_without_hero" in own and not isinstance(own["may_proceed_without_hero"], bool):
        raise StepConfigurationError(
            f"{cls.__name__}.may_proceed_without_hero must be True or False"
        )

    if "concurrency_limit" in own:
        check_class_limit(cls.__name__, own["concurrency_limit"])

    if own.get("schedule") is not None:
        _check_schedule(cls, own["schedule"])

    cls._step_aliases = dict(cls._step_aliases)
    specs = [(attr, value) for attr, value in own.items() if isinstance(value, StepSpec)]
    renamed = [(attr, spec) for attr, spec in specs if spec.renamed_to is not None]
    for attr, spec in specs:
        if spec.renamed_to is not None:
            continue
        name = str(spec.options.get("name") or attr)
        definition = _register(cls, name, spec.fn, spec, cache=False)
        if spec.removed:
            delattr(cls, attr)
        else:
            setattr(cls, attr, spec.fn)
            definition.method_name = attr
    # After every step of the body: a rename may sit above the step it points at.
    for attr, spec in renamed:
        _register_rename(cls, str(spec.options.get("name") or attr), str(spec.renamed_to))
        delattr(cls, attr)
    check_key_methods(cls)


def _register_rename(cls: type[Workflow], old: str, new: str) -> None:
    """Validate ``old = renamed_step(to=new)`` against the class's steps, then record it."""
    label = f"{cls.__name__}: `{old} = renamed_step(to={new!r})`"
    names = {d.name: d for d in cls._step_definitions}
    if old == new:
        raise StepConfigurationError(f"{label} renames a step to itself; delete the line")
    if old in names:
        what = "a removed_step" if names[old].removed else "a step"
        raise StepConfigurationError(
            f"{label}: '{old}' is also {what} of {cls.__name__}. A name is either a step or the "
            "old name of a renamed one; delete one of the two"
        )
    if old in cls._step_aliases and cls._step_aliases[old] != new:
        raise StepConfigurationError(
            f"{label}: '{old}' is already renamed to '{cls._step_aliases[old]}'"
        )
    if new in cls._step_aliases:
        final = cls._step_aliases[new]
        raise StepConfigurationError(
            f"{label}: '{new}' is itself the old name of '{final}'. Point both old names at the "
            f'step that exists: `{old} = renamed_step(to="{final}")`'
        )
    target = names.get(new)
    if target is None:
        defined = ", ".join(d.name for d in cls._step_definitions if not d.removed) or "(none)"
        raise StepConfigurationError(
            f"{label}: {cls.__name__} defines no step '{new}'. The steps it defines are {defined}"
        )
    if target.removed:
        raise StepConfigurationError(
            f"{label}: '{new}' is a removed_step; rename to a step that runs, or make "
            f"`{old} = removed_step()` a gravestone too"
        )
    cls._step_aliases[old] = new
    cls._steps_cache = None


def _register(
    cls: type[Workflow],
    name: str,
    fn: Callable[..., Any] | None,
    spec: StepSpec,
    cache: bool = True,
) -> StepDefinition:
    existing = cls._step_definitions
    if any(d.name == name for d in existing):
        raise StepConfigurationError(f"Step '{name}' is already defined in {cls.__name__}")
    if name in cls._step_aliases:
        raise StepConfigurationError(
            f"Step '{name}' of {cls.__name__} has the old name of a renamed step (`{name} = "
            f"renamed_step(to={cls._step_aliases[name]!r})`); pick another name, or delete that "
            "line once renamed_steps_in_flight() shows it drained"
        )
    for key in ("before_step", "after_step"):
        ref = spec.options.get(key)
        if ref is not None and not any(d.name == str(ref) for d in existing):
            raise StepConfigurationError(
                f"Step '{name}' references non-existent step '{ref}' in {key}=. You can only "
                "reference steps that have already been defined."
            )
    definition = build_definition(cls.__name__, name, fn, spec)
    cls._step_definitions = [*existing, definition]
    cls._steps_cache = None
    return definition


# --- heroes -------------------------------------------------------------------------------


def _check_schedule(cls: builtins.type[Workflow], schedule: Any) -> None:
    """A class's ``schedule``: a valid ``geneva_drive.Schedule``, named after the class unless
    it says otherwise (engine/recurrence.py checks the definition itself)."""
    if not (hasattr(schedule, "validate") and hasattr(schedule, "ticks_after")):
        raise StepConfigurationError(
            f"{cls.__name__}.schedule is {schedule!r}; use geneva_drive.Schedule(cron=...) or "
            "Schedule(every=...)"
        )
    try:
        schedule.validate()
    except ValueError as error:
        raise StepConfigurationError(f"{cls.__name__}.schedule: {error}") from None
    if schedule.workflow is not None and schedule.workflow is not cls:
        raise StepConfigurationError(
            f"{cls.__name__}.schedule is the Schedule of {schedule.workflow.__name__}; give each "
            "class a Schedule of its own"
        )
    schedule.workflow = cls
    if schedule.name is None:
        schedule.name = cls.workflow_name


#: How to set, per workflow, what a class attribute of the same name would hide.
_COLUMN_HINTS = {
    "allow_multiple": "pass create(..., allow_multiple=True)",
    "metadata_": "pass create(..., _metadata={...}) or set it in a step",
}


def _refuse_shadowed_columns(cls: builtins.type[Workflow]) -> None:
    """A class attribute named like a column of every workflow (``allow_multiple = True``)
    would replace the column for that class: its rows could not be written. Refused when the
    class is defined, with the way to set it per workflow."""
    # From the table, not the mapper: inspecting the mapper now would configure the mappers
    # in the middle of defining this class. ``metadata`` is mapped as ``metadata_``.
    columns = {c.key for c in Workflow.__table__.columns} - {"metadata"} | {"metadata_"}
    for name in sorted(columns & set(cls.__dict__)):
        hint = _COLUMN_HINTS.get(name, "it is the engine's; choose another name")
        raise StepConfigurationError(
            f"{cls.__name__}.{name}: `{name}` is a column of every workflow, not a class "
            f"option; {hint}."
        )


def _hero_pair(hero: Any) -> tuple[str, str]:
    """A hero given as a ``(hero_type, hero_id)`` pair, or as the mapped object."""
    if isinstance(hero, tuple):
        if len(hero) != 2 or not all(isinstance(part, str | int) for part in hero):
            raise InvalidInputError(
                f"hero {hero!r}: give the mapped object or a (hero_type, hero_id) pair, "
                "e.g. ('Order', '42')"
            )
        return str(hero[0]), str(hero[1])
    return hero_key(hero)


def hero_key(hero: Any) -> tuple[str, str]:
    try:
        mapper = inspect(type(hero))
    except Exception as exc:
        raise InvalidInputError(
            f"hero must be an SQLAlchemy-mapped object, got {type(hero).__name__}"
        ) from exc
    primary_key = mapper.primary_key
    if len(primary_key) != 1:
        raise InvalidInputError(
            f"hero {type(hero).__name__} must have a single-column primary key "
            f"(it has {len(primary_key)})"
        )
    identity = mapper.primary_key_from_instance(hero)[0]
    if identity is None:
        raise InvalidInputError(
            f"hero {type(hero).__name__} has no primary key yet; add it to the session and flush "
            "before creating the workflow"
        )
    registry.register_hero_class(type(hero))
    return type(hero).__name__, str(identity)


def load_hero(
    session: Session | None, hero_type: str | None, hero_id: str | None, *, fresh: bool = False
) -> Any:
    """The hero row, or None. ``fresh``: read from the database even when the session holds
    it (a check that must see this transaction's view, not an earlier one's)."""
    if hero_type is None or hero_id is None or session is None:
        return None
    cls = hero_class(hero_type)
    if cls is None:
        raise LookupError(
            f"hero_type {hero_type!r} names no mapped class in this process; import the module "
            "that defines it (GENEVA_WORKFLOW_MODULES) or call engine.register_hero_class()"
        )
    column = inspect(cls).primary_key[0]
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        python_type = str
    key: Any = hero_id
    if python_type is int:
        key = int(hero_id)
    elif python_type is uuid.UUID:
        key = uuid.UUID(hero_id)
    return session.get(cls, key, populate_existing=fresh)


def remember_hero(workflow: Workflow, hero: Any) -> None:
    """Let ``workflow.hero`` return ``hero`` (just read for it) without reading it again."""
    workflow.__dict__["_hero_cache"] = ((workflow.hero_type, workflow.hero_id), hero)


def _hero_identity_ready(session: Session, hero: Any) -> None:
    state = inspect(hero, raiseerr=False)
    if state is None:
        raise InvalidInputError(
            f"hero must be an SQLAlchemy-mapped object, got {type(hero).__name__}"
        )
    if state.pending or (state.transient and hero not in session):
        if state.transient:
            session.add(hero)
        session.flush()


def _resolve_session(session: AnySession | None, hero: Any) -> Session:
    if session is not None:
        return db.plain_session(session)
    if hero is not None:
        try:
            found = object_session(hero)
        except UnmappedInstanceError:
            found = None
        if found is not None:
            return found
    current = db.current_session()
    if current is not None:
        return current
    raise UsageError(
        "Workflow.create() needs a session: pass session=, create the hero in a session, or "
        "call geneva_drive.db.set_current_session()"
    )


def _duplicate_error(
    cls: type[Workflow], workflow: Workflow, existing_id: int | None
) -> DuplicateWorkflowError:
    hero = f"{workflow.hero_type} #{workflow.hero_id}" if workflow.hero_type else "no hero"
    which = f" (workflow #{existing_id})" if existing_id is not None else ""
    return DuplicateWorkflowError(
        f"An ongoing {cls.__name__} already exists for {hero}{which}. Wait for it to finish, "
        "cancel it, or pass allow_multiple=True to run several at once."
    )


__all__ = [
    "CURRENT_STEP_STATES",
    "Workflow",
    "executing",
    "hero_key",
    "load_hero",
    "register_hero_class",
    "registered_workflows",
    "unregister",
    "workflow_class",
]
