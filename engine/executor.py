"""The executor: runs one step execution in three phases.

1. **Prepare**, under the workflow lock then the execution lock, in one transaction: the checks
   in the gem's order (duplicate job, workflow not runnable, hero missing, step not defined,
   removed step, cancel_if, skip_if, the signal gate), then the start transition.
2. **Body**, with no lock and no transaction of ours: the step method runs; flow control,
   resumable interruptions and exceptions are captured as a result.
3. **Finalize**, under the locks again: the result becomes a :class:`~geneva_drive.outcomes.
   Decision` (engine/outcomes.py, one table for returns, flow control and exception policies),
   recorded as the execution's state and outcome, the workflow's one new state (``finished``
   straight from ``performing`` after the last step), and the next execution.

Any exception destined for the caller (a step's own exception, StepNotDefinedError) is raised
only after the transaction that records it has committed, so nothing is lost or rolled back.

The body's own writes (through ``self.session``, hooks included) commit if and only if the
attempt's outcome commits as one the step chose (it returned, or called flow control) or as a
resumable checkpoint, with the cursor. They roll back when the body raised, when an operator or
housekeeping discarded the attempt while it ran (paused, canceled, skipped, moved past, stale),
and when the database connection died under them: then the attempt fails through its exception
policy with :class:`DatabaseConnectionLostError` instead of succeeding without them.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, Table, bindparam, event, func, literal_column, select
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from geneva_drive import (
    children,
    current_worker,
    db,
    inline,
    limits,
    persistence,
    scheduling,
    signals,
    timeouts,
    tracing,
)
from geneva_drive.compiled import Compiled
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import (
    DatabaseConnectionLostError,
    StepConfigurationError,
    StepNotDefinedError,
)
from geneva_drive.flow_control import FlowAction, FlowInterrupt, Interrupt
from geneva_drive.instrumentation import (
    ContextAdapter,
    inline_successor,
    instrument,
    log_context,
    report_context,
    report_error,
)
from geneva_drive.iteration import IterableStep
from geneva_drive.models import Signal, StepExecution
from geneva_drive.outcomes import Action, Cause, Decision, Follow, decide, prepare_failed
from geneva_drive.policies import PolicyResult, resolution_stack
from geneva_drive.shutdown import clear_shutdown, request_shutdown, shutdown_requested
from geneva_drive.signal_matcher import matcher_name
from geneva_drive.states import (
    Outcome,
    StepState,
    WorkflowState,
    is_runnable,
    is_still_running,
)
from geneva_drive.steps import StepDefinition, evaluate_condition
from geneva_drive.transitions import (
    cancel_execution,
    complete_execution,
    fail_execution,
    park_execution,
    run_outcome,
    skip_execution,
    start_execution,
    transition_step,
    transition_workflow,
    workflow_canceled,
    workflow_paused,
    workflow_performing,
    workflow_ready,
)
from geneva_drive.workflow import Workflow, executing, load_hero, remember_hero

log = logging.getLogger("geneva_drive.executor")

# --- did the body write? -------------------------------------------------------------------
# A write the body sent to the server (an INSERT through session.execute, a flush) is in the
# session's transaction but no longer among its pending ORM changes. A dead connection loses it
# with the transaction, so finalize must know it happened: while a body runs, every statement
# its thread sends that is not a plain read marks the session (session.info). A commit (a
# resumable checkpoint) or a rollback clears the mark: those writes are settled.
_WROTE = "geneva_body_wrote"
#: How often finalize runs again when the database picks its transaction as a deadlock victim
#: (InnoDB's unique-index checks lock neighbouring entries: workers finishing neighbouring
#: workflows' steps can deadlock although each takes its rows in the same order).
_DEADLOCK_RETRIES = 3
_watch = threading.local()


def _is_read(statement: str) -> bool:
    return statement.lstrip()[:6].upper() in ("SELECT", "SHOW", "PRAGMA")


@event.listens_for(Engine, "before_cursor_execute")
def _note_body_write(
    _conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, _many: bool
) -> None:
    session: Session | None = getattr(_watch, "session", None)
    # Only the body session's own engine: a statement the body sends through another engine
    # (an admin connection, another database) is not in the step's transaction.
    if session is not None and not _is_read(statement) and _conn.engine is session.get_bind():
        session.info[_WROTE] = True


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _writes_settled(session: Session) -> None:
    if session.info:
        session.info.pop(_WROTE, None)


def _has_pending_changes(session: Session) -> bool:
    """ORM changes not yet flushed (``dirty`` lists any object whose attribute was set; only a
    net change counts)."""
    if session.new or session.deleted:
        return True
    return any(session.is_modified(obj) for obj in session.dirty)


@dataclass
class Completed:
    pass


@dataclass
class Interruption:
    wait: timedelta | None = None


@dataclass
class Captured:
    error: Exception


Result = Completed | Interruption | Captured | FlowInterrupt


def execute(
    step_execution_id: int,
    *,
    session: Session | None = None,
    interruptible: bool = True,
    max_iterations: int | None = None,
    missing_ok: bool = False,
    budget: inline.Budget | None = None,
) -> bool:
    """Run one step execution. Entry point of workers and test helpers.

    ``session``: run in this session (test helpers); otherwise a new one is opened and closed.
    ``interruptible=False`` disables resumable interruption checks (test helpers);
    ``max_iterations`` overrides the step's own value (``run_iterations``).
    Re-raises the step's exception after its outcome is committed.

    Returns False, having done nothing, when the execution does not exist (logged as a warning,
    or only at debug level with ``missing_ok``: the Celery task retries then warns itself).

    ``budget`` (workers): run immediately-due successors here instead of sending them, within
    the budget (engine/inline.py). Each successor runs as its own execution, in a session of
    its own, exactly as if its message had been delivered to this worker.
    """
    first = _execute_one(
        step_execution_id, session, interruptible, max_iterations, missing_ok, budget
    )
    ran = first
    while ran is not None and ran.successor_id is not None:
        if inline_successor.receivers:
            inline_successor.send(
                "engine",
                execution_id=ran.successor_id,
                predecessor_id=ran.execution_id,
                workflow_id=ran.workflow_id,
                steps=budget.steps if budget is not None else 0,
            )
        successor_id, workflow_id = ran.successor_id, ran.workflow_id
        try:
            if ran.started is not None:
                ran = _run_started(ran.started, own=session is None)
            else:
                ran = _execute_one(
                    successor_id, session, interruptible, max_iterations, False, budget
                )
        except Exception as error:
            # The successor's own failure: its outcome is committed and was reported under its
            # own execution by its executor. It is not the delivered task's failure (that step
            # succeeded), so it is logged under the successor's ids, not raised from here
            # (Celery would count it against the predecessor's task id).
            ContextAdapter(log, {"execution_id": successor_id, "workflow_id": workflow_id}).info(
                "inline successor execution %s raised %s: recorded on its own execution",
                successor_id,
                type(error).__name__,
            )
            break
    return first is not None


def _execute_one(
    step_execution_id: int,
    session: Session | None,
    interruptible: bool,
    max_iterations: int | None,
    missing_ok: bool,
    budget: inline.Budget | None,
) -> Executor | None:
    """One execution (None: it does not exist); ``successor_id`` names the inline successor
    this worker runs next."""
    own = session is None
    active = session if session is not None else db.new_session()
    handed_over = False
    try:
        executor = Executor(active, step_execution_id, interruptible, max_iterations)
        executor.missing_ok = missing_ok
        executor.budget = budget
        if budget is not None:
            budget.steps += 1
        executor.owns_session = own
        ran = executor.run()
        # A successor started in this execution's last commit continues in this session.
        handed_over = own and executor.started is not None
        return executor if ran else None
    finally:
        if own and not handed_over:
            active.close()


def _run_started(executor: Executor, *, own: bool) -> Executor:
    """The body and finalize of a successor its predecessor's finalize started (its session
    is the predecessor's; closed here unless it is handed on once more)."""
    handed_over = False
    try:
        if executor.budget is not None:
            executor.budget.steps += 1
        executor.run_started()
        handed_over = own and executor.started is not None
        return executor
    finally:
        if own and not handed_over:
            executor.session.close()


# The lock statement of both phases: the workflow joined to the execution, workflow first (its
# rows are locked first on PostgreSQL). A Core statement built once, only the id bound: its row
# becomes (or refreshes) the ORM objects through persistence.load() at a third of the cost of
# the same ORM query.
_WORKFLOWS = Workflow.__table__
_EXECUTIONS = StepExecution.__table__
assert isinstance(_WORKFLOWS, Table) and isinstance(_EXECUTIONS, Table)
_LOCK_READ = (
    select(_WORKFLOWS, _EXECUTIONS)
    .join(_EXECUTIONS, _EXECUTIONS.c.workflow_id == _WORKFLOWS.c.id)
    .where(_EXECUTIONS.c.id == bindparam("execution_id"))
)
_LOCK_SQLITE = Compiled(_LOCK_READ)
_LOCK_FOR_UPDATE = Compiled(_LOCK_READ.with_for_update())
# Finalize's, where its commit may start the successor (PostgreSQL, the opt-in of
# ``_start_successor``): the same read, with an id drawn for that successor's row, which is then
# inserted started at the commit (inline.deferred_id, persistence.write_deferred).
_LOCK_FOR_UPDATE_NEXT_ID = Compiled(
    _LOCK_READ.add_columns(
        func.nextval(func.pg_get_serial_sequence(_EXECUTIONS.name, _EXECUTIONS.c.id.name))
    ).with_for_update()
)
# The row's columns, in order: the workflow's, then the execution's.
_WORKFLOW_NAMES = tuple(column.name for column in _WORKFLOWS.columns)
_EXECUTION_NAMES = tuple(column.name for column in _EXECUTIONS.columns)
_SPLIT = len(_WORKFLOW_NAMES)


def error_class_name(error: BaseException) -> str:
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def write_error(execution: StepExecution, error: BaseException) -> None:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    backtrace = "".join(lines).rstrip("\n")
    execution.error_message = str(error)
    execution.error_backtrace = backtrace
    execution.error_class_name = error_class_name(error)
    execution.merge_metadata(exception=exception_info(error, backtrace))


def exception_info(error: BaseException, backtrace: str | None = None) -> dict[str, Any]:
    if backtrace is None:
        backtrace = "".join(
            traceback.format_exception(type(error), error, error.__traceback__)
        ).rstrip("\n")
    return {
        "class": error_class_name(error),
        "message": str(error),
        "backtrace": backtrace.split("\n"),
    }


def consecutive_reattempt_count(session: Session, workflow: Workflow, step_name: str) -> int:
    """Reattempts by policy since the step last completed."""
    last_clean = session.scalars(
        select(StepExecution.id)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.step_name == step_name,
            StepExecution.state == StepState.COMPLETED,
            StepExecution.outcome != Outcome.REATTEMPTED,
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    ).first()
    query = select(StepExecution.metadata_).where(
        StepExecution.workflow_id == workflow.id,
        StepExecution.step_name == step_name,
        StepExecution.outcome == Outcome.REATTEMPTED,
    )
    if last_clean is not None:
        query = query.where(StepExecution.id > last_clean)
    return sum(
        1
        for metadata in session.scalars(query)
        if (metadata or {}).get("reattempt_reason") not in ("flow_control", "discarded")
    )


def _outcomes(*outcomes: Outcome) -> list[Any]:
    # Written into the SQL: a prepared statement takes no expanding IN list (engine/compiled.py).
    return [literal_column(f"'{outcome}'") for outcome in outcomes]


def _earlier_attempts() -> Compiled:
    """How many attempts of a step came before an execution: those that ended without getting
    it done (reattempted, failed, canceled, recovered; started ones) since it last got done."""
    column = _EXECUTIONS.c
    same_step = (
        column.workflow_id == bindparam("workflow_id", type_=column.workflow_id.type),
        column.step_name == bindparam("step_name", type_=column.step_name.type),
        column.id < bindparam("execution_id", type_=column.id.type),
    )
    last_done = (
        select(func.max(column.id))
        .where(
            *same_step,
            column.outcome.in_(_outcomes(Outcome.SUCCESS, Outcome.SKIPPED, Outcome.TIMED_OUT)),
        )
        .scalar_subquery()
    )
    return Compiled(
        select(func.count())
        .select_from(_EXECUTIONS)
        .where(
            *same_step,
            column.started_at.is_not(None),
            column.outcome.in_(
                _outcomes(Outcome.REATTEMPTED, Outcome.FAILED, Outcome.CANCELED, Outcome.RECOVERED)
            ),
            column.id > func.coalesce(last_done, 0),
        )
    )


_EARLIER_ATTEMPTS = _earlier_attempts()


def attempt_number(session: Session, execution: StepExecution) -> int:
    """1 for a step's first attempt, plus one for each earlier attempt of the same step of the
    same workflow that ended without getting it done (a reattempt, a failure that was resumed,
    a worker that died) since it last got done; a resumable step's checkpoints continue one
    attempt (docs/MANUAL.md, "Tracing"). One prepared read on the session's connection, which
    flushes nothing; the executor asks only when tracing is on."""
    row = _EARLIER_ATTEMPTS.first(
        session.connection(),
        {
            "workflow_id": execution.workflow_id,
            "step_name": execution.step_name,
            "execution_id": execution.id,
        },
    )
    return 1 + int(row[0] if row is not None else 0)


def _discarded(workflow: Workflow, execution: StepExecution) -> bool:
    """Has the attempt been taken from under its body (an operator, housekeeping)?"""
    return execution.state != StepState.IN_PROGRESS or workflow.state != WorkflowState.PERFORMING


class Executor:
    def __init__(
        self,
        session: Session,
        step_execution_id: int,
        interruptible: bool = True,
        max_iterations: int | None = None,
    ) -> None:
        self.session = session
        self.execution_id = step_execution_id
        self.interruptible = interruptible
        self.max_iterations = max_iterations
        self.error: BaseException | None = None
        self.log: logging.LoggerAdapter[logging.Logger] = ContextAdapter(
            log, {"execution_id": step_execution_id}
        )
        self.start_time = 0.0
        self.step_def: StepDefinition | None = None
        #: The step that ran, once finalize has cleared ``current_step_name``.
        self.current: str | None = None
        #: A missing execution is logged at debug level only (the caller retries and warns).
        self.missing_ok = False
        #: Workers: the inline-successor budget (engine/inline.py); None sends every successor.
        self.budget: inline.Budget | None = None
        #: The successor execution this worker runs next (claimed at the last commit).
        self.successor_id: int | None = None
        self.successor: StepExecution | None = None
        #: Whether this executor's session is its own (not a caller's): only then may a
        #: successor be started in its commit, since the successor then takes the session over.
        self.owns_session = False
        #: That successor's executor when this finalize's commit also started it (its start
        #: needed no check of its own: ``_start_successor``); None: it starts in its own
        #: transaction, as a delivered execution does.
        self.started: Executor | None = None
        #: Finalize's lock read draws an id for a successor its commit may start (PostgreSQL):
        #: that successor's row is then inserted started, with this step's outcome.
        self.draws_id = False
        #: Set on a started successor: what its prepare would have returned, and its hero as
        #: read for the start (None: the class proceeds without one).
        self._prepared: tuple[Workflow, StepExecution, StepDefinition] | None = None
        self._hero: Any = None
        #: The workflow object of the phase running now (finalize may load a new one).
        self.workflow: Workflow | None = None
        #: Its id, kept as a plain value (the object expires at commit).
        self.workflow_id: int | None = None
        #: Finalize: the connection died under writes the body had made (they are gone).
        self.lost: DBAPIError | None = None
        #: The error last handed to the error reporter: a finalize run again after a deadlock
        #: resolves the same error once more, and the reporter (Sentry, logs) sees it once.
        self.reported: BaseException | None = None
        #: The attempt's span once it starts (docs/MANUAL.md, "Tracing"); None with tracing off.
        self.span: tracing.Span | None = None

    # --- locking -----------------------------------------------------------------------

    def _lock(self) -> tuple[Workflow, StepExecution] | None:
        """Lock the workflow row, then the execution row, both reloaded, in one statement.

        One joined ``SELECT`` reads both rows in a single round trip. PostgreSQL: ``FOR
        UPDATE`` on the join locks the rows in FROM order — the workflow first, then the
        execution — so two executors or an executor and an operator cannot deadlock. SQLite:
        ``BEGIN IMMEDIATE`` already holds the database write lock, so the plain read suffices.

        Prepare gets new objects; finalize gets the ones prepare loaded, refreshed (or new
        ones, if the body detached them). What the body changed is written first, as the
        ORM's autoflush would before a query.
        """
        session = self.session
        db.begin_write(session)
        persistence.flush(session)
        dialect = dialect_for(session)
        draws_id = self.draws_id and dialect.combined_insert
        if draws_id:
            statement = _LOCK_FOR_UPDATE_NEXT_ID
        else:
            statement = _LOCK_FOR_UPDATE if dialect.row_locks else _LOCK_SQLITE
        row = statement.first(session.connection(), {"execution_id": self.execution_id})
        if row is None:
            return None
        if draws_id:
            inline.offer_id(session, row[-1])
            row = row[:-1]
        workflow = persistence.load(
            session, Workflow, dict(zip(_WORKFLOW_NAMES, row[:_SPLIT], strict=True))
        )
        execution = persistence.load(
            session, StepExecution, dict(zip(_EXECUTION_NAMES, row[_SPLIT:], strict=True))
        )
        self.workflow = workflow
        return workflow, execution

    def _lock_reconnecting(
        self, *, body_wrote: bool = False
    ) -> tuple[Workflow, StepExecution] | None:
        """``_lock()``, once more on a new connection if the pooled one turned out dead.

        A connection used moments ago is handed out untested (engine/db.py: the idle-window
        check), so a database restart or a killed backend since then shows up here, at the
        phase's first statement. A disconnect invalidates the pool's other connections too, and
        the retry runs on a new one.

        Starting the phase again loses nothing when the transaction held nothing of the step's.
        When it did - ``body_wrote`` (statements the body already sent) or changes not yet
        flushed - those writes died with the connection: the phase still starts again, on a new
        connection, but ``self.lost`` records the error, and finalize fails the attempt with
        it instead of recording an outcome without the writes.
        """
        session = self.session
        pending = body_wrote or _has_pending_changes(session)
        try:
            return self._lock()
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
            session.rollback()
            if pending:
                self.lost = error
                self.log.warning(
                    "database connection lost (%s) after the step wrote through its session; "
                    "those writes were rolled back, so this attempt fails",
                    error.orig,
                )
            else:
                self.log.warning(
                    "database connection lost (%s); starting the phase again", error.orig
                )
            return self._lock()

    def _settle_inline(self, *, runs_next: bool) -> None:
        """Before a phase's commit: keep the successor this phase claimed to run it next, or
        queue its message as usual (a step that raised ends the chain: its error is raised
        once the outcome is committed)."""
        workflow = self.workflow
        successor = (
            inline.settle(self.session, workflow, runs_next=runs_next and self.error is None)
            if workflow is not None
            else None
        )
        self.successor = successor
        self.successor_id = successor.id if successor is not None else None
        if self.successor_id is not None:
            self.workflow_id = workflow.id if workflow is not None else None
            self.log.debug("running successor execution %s in this worker", self.successor_id)

    def _commit(self, *, asynchronous: bool = False) -> None:
        # PostgreSQL: the phase's UPDATEs (and, for the start, the asynchronous-commit setting)
        # go out as one statement (engine/persistence.py).
        persistence.flush(self.session, asynchronous_commit=asynchronous)
        self.session.commit()

    def _context(self, workflow: Workflow, execution: StepExecution) -> dict[str, Any]:
        return report_context(workflow, execution)

    def _payload(self, workflow: Workflow, execution: StepExecution) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "execution_id": execution.id,
            "workflow_id": workflow.id,
            "workflow_class": type(workflow).__name__,
            "workflow_type": workflow.type,
            "step_name": execution.step_name,
        }
        if self.step_def is not None and self.step_def.resumable:
            payload["resumable"] = True
        return payload

    # --- the three phases ----------------------------------------------------------------

    def run(self) -> bool:
        """Run the three phases; False when the execution does not exist (nothing done)."""
        active = tracing.tracer()
        began = time.time_ns() if active is not None else 0
        try:
            inline.arm(self.session, self.budget)
            locked = self._lock_reconnecting()
            if locked is None:
                inline.disarm(self.session)
                self.session.rollback()
                if self.missing_ok:
                    self.log.debug("step execution not found")
                else:
                    self.log.warning("step execution not found; nothing to do")
                return False
            workflow, execution = locked
            self.log = ContextAdapter(log, log_context(workflow, execution))
            prepared = self.prepare(workflow, execution)
            if prepared is not None and active is not None:
                # Before the start's commit: a workflow's first traced step stores its context.
                self.span = self._start_span(active, workflow, execution, began)
            # A step that did not start here (skipped, say) may have scheduled its successor.
            self._settle_inline(runs_next=prepared is None)
            # The start transition need not wait for its own WAL flush (PostgreSQL: one fsync,
            # 0.5-4 ms on the benchmark machine, a large part of a hop). Lost only if the
            # database server itself crashes before the next flush, it reverts the execution
            # to scheduled - what a worker crash mid-step leads to anyway - and the finalize
            # commit, which is synchronous, flushes it in WAL order.
            self._commit(
                asynchronous=prepared is not None
                and not settings.synchronous_start_commit
                and dialect_for(self.session).asynchronous_commit
            )
        except BaseException as error:
            inline.disarm(self.session)
            self.session.rollback()
            if self.span is not None:
                tracing.abandon(self.span, error)
                self.span = None
            raise
        if self.error is not None:
            raise self.error
        if prepared is None:
            return True
        step_def, signal = prepared
        return self._body_and_finalize(workflow, execution, step_def, signal)

    def run_started(self) -> bool:
        """Phases 2 and 3 of a successor its predecessor's finalize started
        (:meth:`_start_successor`)."""
        assert self._prepared is not None
        workflow, execution, step_def = self._prepared
        self._prepared = None
        active = tracing.tracer()
        if active is not None:
            self.span = self._start_span(active, workflow, execution, time.time_ns())
        return self._body_and_finalize(workflow, execution, step_def, None)

    def _start_span(
        self, active: tracing.Tracer, workflow: Workflow, execution: StepExecution, began: int
    ) -> tracing.Span:
        return tracing.start_step(
            active,
            workflow,
            execution,
            attempt=lambda: attempt_number(self.session, execution),
            start_time=began,
        )

    def _body_and_finalize(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        signal: Signal | None,
    ) -> bool:
        span, self.span = self.span, None
        if span is None:
            return self._attempt(workflow, execution, step_def, signal)
        with tracing.step_scope(span, execution):
            return self._attempt(workflow, execution, step_def, signal)

    def _attempt(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        signal: Signal | None,
    ) -> bool:
        try:
            result = self.run_body(workflow, execution, step_def, signal)
        except BaseException:
            # A hook raised: it escapes with the execution in progress, and the attempt's
            # writes roll back, in the caller's session too. Its worker lives on, so its lease
            # never expires for it: the heartbeat hands it to recovery (current_worker).
            self.session.rollback()
            current_worker.abandon(self.execution_id)
            raise
        wrote = bool(self.session.info.get(_WROTE)) or _has_pending_changes(self.session)
        if isinstance(result, Captured):
            # The attempt failed: what it wrote since its last checkpoint rolls back (a step that
            # raised is not a success; its policy may run it again). The body's own database
            # error (a dropped connection, a refused write) leaves a transaction that cannot
            # commit anyway: rolled back, the outcome is recorded now, by policy, instead of the
            # execution sitting in_progress until housekeeping finds it stuck.
            self.session.rollback()
            wrote = False

        # A class with a cancel condition never starts a successor with the outcome: no id.
        self.draws_id = self._may_start_successor() and not type(workflow)._cancel_conditions
        for retry in range(_DEADLOCK_RETRIES + 1):
            try:
                inline.arm(self.session, self.budget)
                self.finalize(workflow, execution, step_def, result, body_wrote=wrote)
                if execution.limit_slot is not None or execution.step_limit_slot is not None:
                    # Wake the next in line (docs/MANUAL.md, "Concurrency and rate limits").
                    limits.release(self.session, execution, scheduling.enqueue_execution)
                self._settle_inline(runs_next=True)
                self.started = self._start_successor()
                self._commit()
                break
            except DBAPIError as error:
                self.started = None
                inline.disarm(self.session)
                self.session.rollback()
                # A deadlock victim's transaction rolled back whole. With nothing of the body's
                # in it, recording the outcome again is the whole remedy; with the body's writes
                # in it, they are gone, and the execution stays in progress, recovered as after
                # a crash here (docs/MANUAL.md "When a worker dies"): by its worker's lease if
                # the process dies, else by its heartbeat, which recovers what it abandoned.
                if wrote or retry == _DEADLOCK_RETRIES or not db.is_deadlock(error):
                    current_worker.abandon(self.execution_id)
                    raise
                self.log.warning(
                    "the database chose this step's finalize as a deadlock victim (%s); "
                    "recording its outcome again",
                    error.orig,
                )
            except BaseException:
                self.started = None
                inline.disarm(self.session)
                self.session.rollback()
                current_worker.abandon(self.execution_id)
                raise
        if self.error is not None:
            raise self.error
        if self.started is not None:
            self.started.adopt_committed()
        return True

    def _start_successor(self) -> Executor | None:
        """Start the successor this worker runs next in this finalize's own transaction.

        ``settings.inline_successor_start_with_outcome`` (off by default: a worker that dies
        after this commit leaves the successor in progress, for stuck recovery, instead of due
        and unsent). Only a start that runs no code of the application: the workflow class has
        no cancel condition, and the step no skip condition, no signal or children gate and no
        concurrency or rate limit. Prepare could then only check the hero (read here, in this
        transaction) and write the start transition: :meth:`_prepare` runs here, with the
        outcome, and the step's own start transaction (a lock, an UPDATE, a commit) is not
        needed. Any other successor starts in its own transaction, its checks
        under its own lock, so nothing they raise can take this outcome down.
        """
        if not self._may_start_successor():
            return None
        workflow, execution = self.workflow, self.successor
        if workflow is None or execution is None or execution.state != StepState.SCHEDULED:
            return None
        cls = type(workflow)
        step_def = workflow.steps.named(execution.step_name)
        if (
            step_def is None
            or not inline.start_runs_no_code(workflow, step_def)
            or execution.limit_slot is not None
            or execution.step_limit_slot is not None
            or execution.rate_slot is not None
            or execution.continues_from_id is not None
        ):
            return None
        hero = None
        if not cls.may_proceed_without_hero:
            # Prepare's hero check, read in this transaction as prepare would read it in its
            # own. A hero that is gone (or cannot be looked up) is left to the successor's own
            # prepare, which cancels the workflow (or applies the policy) under its own lock.
            # Without an autoflush: what is pending is this transaction's engine rows (the
            # body's writes went out before finalize's lock), which the hero's read does not
            # see, and a successor row inserted at the commit stays one statement with them.
            try:
                with self.session.no_autoflush:
                    hero = load_hero(self.session, workflow.hero_type, workflow.hero_id, fresh=True)
            except SQLAlchemyError:
                raise
            except Exception:
                return None
            if hero is None:
                return None
            remember_hero(workflow, hero)  # prepare's check reads it, without a second query
        successor = Executor(self.session, execution.id, self.interruptible, self.max_iterations)
        successor.budget = self.budget
        successor.owns_session = True
        successor.workflow = workflow
        successor.workflow_id = workflow.id
        successor.log = ContextAdapter(log, log_context(workflow, execution))
        # Prepare itself, its every check and event, with nothing left that runs the
        # application's code: it can only start the step.
        if successor._prepare(workflow, execution) is None:
            return None
        successor._prepared = (workflow, execution, step_def)
        successor._hero = hero
        self.log.debug("successor execution %s starts with this outcome's commit", execution.id)
        return successor

    def _may_start_successor(self) -> bool:
        """Whether this finalize's commit may start its successor (the opt-in, and a session
        the successor can take over)."""
        return (
            settings.inline_successor_start_with_outcome
            and self.owns_session
            and self.budget is not None
        )

    def adopt_committed(self) -> None:
        """After the commit that started this successor: its session holds nothing but fresh
        copies of its two rows, as the session of a delivered execution would (the
        predecessor's objects, and whatever its body loaded or set on them, are let go)."""
        assert self._prepared is not None
        workflow, execution, step_def = self._prepared
        session = self.session
        workflow_row, execution_row = persistence.values(workflow), persistence.values(execution)
        session.expunge_all()
        fresh_workflow = persistence.load(session, Workflow, workflow_row)
        fresh_execution = persistence.load(session, StepExecution, execution_row)
        if self._hero is not None:
            # Read for the start in the commit just made, as prepare reads it in its own.
            session.add(self._hero)
            remember_hero(fresh_workflow, self._hero)
            self._hero = None
        self.workflow = fresh_workflow
        self._prepared = (fresh_workflow, fresh_execution, step_def)

    # --- phase 1 ---------------------------------------------------------------------------

    def prepare(
        self, workflow: Workflow, execution: StepExecution
    ) -> tuple[StepDefinition, Signal | None] | None:
        try:
            return self._prepare(workflow, execution)
        except SQLAlchemyError:
            raise
        except Exception as error:
            self.handle_prepare_exception(workflow, execution, error)
            return None

    def _prepare(
        self, workflow: Workflow, execution: StepExecution
    ) -> tuple[StepDefinition, Signal | None] | None:
        session = self.session
        if execution.state != StepState.SCHEDULED:
            self.log.info("already %s, skipping duplicate job", execution.state)
            return None
        if not is_runnable(workflow.state):
            cancel_execution(execution)
            self.log.info("workflow is %s; canceling the execution", workflow.state)
            return None
        if not type(workflow).may_proceed_without_hero and workflow.hero is None:
            cancel_execution(execution)
            workflow_canceled(workflow)
            self.log.info("hero is missing; canceling the workflow")
            return None
        step_def = workflow.steps.named(execution.step_name)
        if step_def is None:
            message = f"Step '{execution.step_name}' is not defined in {type(workflow).__name__}"
            error = StepNotDefinedError(message, step_execution=execution, workflow=workflow)
            execution.error_message = message
            execution.error_class_name = error_class_name(error)
            fail_execution(execution)
            workflow_paused(workflow)
            self.log.error("%s; pausing the workflow", message)
            self.error = error
            # Counted like every other step run that ended (step_executions_total), with an
            # outcome of its own: a deploy that stranded workflows shows on the dashboards.
            with instrument("step", self._payload(workflow, execution)) as payload:
                payload["outcome"] = "step_not_defined"
            return None
        self.step_def = step_def
        if step_def.removed:
            skip_execution(execution)
            signals.settle_for_skipped(session, execution)
            workflow_ready(workflow)
            scheduling.schedule_next_step(session, workflow)
            self.log.info("step was removed (removed_step); skipping to the next step")
            return None

        if not self.preconditions(workflow, execution, step_def):
            return None

        signal: Signal | None = None
        if step_def.waits_for_signal:
            if execution.signal_id is not None:
                signal = session.get(Signal, execution.signal_id)
            elif execution.timed_out_at is None:  # else: on_timeout="run" fired, no signal
                signal = signals.attach_at_gate(session, workflow, execution, step_def)
                if signal is None and not (
                    step_def.timeout is not None
                    and timeouts.continues_timed_out_run(session, execution)
                ):
                    park_execution(
                        execution, matcher_name(step_def.signal_matcher), step_def.timeout
                    )
                    self.log.info("parked waiting for %s", step_def.signal_matcher)
                    return None
        elif step_def.wait_for_children and not children.pass_gate(
            session, workflow, execution, step_def
        ):
            return None  # parked until its children end, or on_child_failure ended it

        if (
            execution.limit_slot is not None
            or execution.step_limit_slot is not None
            or execution.rate_slot is not None
        ) and not limits.claim(
            session, workflow, execution, step_def, scheduling.enqueue_execution
        ):
            return None  # deferred: still scheduled, not an attempt (docs/MANUAL.md, "Concurrency and rate limits")
        start_execution(execution)
        workflow_performing(workflow, step_def.name)
        if execution.continues_from_id is not None:
            self.log.info("resuming from cursor %r", execution.cursor_value)
        return step_def, signal

    def preconditions(
        self, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
    ) -> bool:
        with instrument("precondition", self._payload(workflow, execution)) as payload:
            try:
                if any(evaluate_condition(c, workflow) for c in type(workflow)._cancel_conditions):
                    cancel_execution(execution)
                    workflow_canceled(workflow)
                    payload["outcome"] = "canceled"
                    return False
                if step_def.should_skip(workflow):
                    skip_execution(execution)
                    signals.settle_for_skipped(self.session, execution)
                    workflow_ready(workflow)
                    scheduling.schedule_next_step(self.session, workflow)
                    payload["outcome"] = "skipped"
                    return False
            except SQLAlchemyError:
                raise
            except Exception as error:
                payload["outcome"] = "exception"
                payload["exception"] = error
                self.handle_policy(workflow, execution, step_def, error, "precondition")
                return False
            payload["outcome"] = "passed"
            return True

    def handle_prepare_exception(
        self, workflow: Workflow, execution: StepExecution, error: Exception
    ) -> None:
        """Any other exception in prepare: the step fails, the policy moves only the workflow."""
        try:
            step_def = workflow.steps.named(execution.step_name)
        except Exception:
            step_def = None
        write_error(execution, error)
        fail_execution(execution)
        result = self.resolve(workflow, step_def, execution.step_name, error)
        self.report(workflow, execution, error, result)
        self._follow(workflow, execution, step_def, prepare_failed(result.decision), result.wait)
        self.log.error(
            "prepare raised %s: %s; workflow now %s", type(error).__name__, error, workflow.state
        )
        self.error = error

    # --- phase 2 ---------------------------------------------------------------------------

    def run_body(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        signal: Signal | None,
    ) -> Result:
        """The hooks and the body. What the hooks write follows the attempt's outcome as the
        body's writes do. A hook's exception escapes (the execution
        stays in_progress for housekeeping); ``run()`` rolls the attempt's writes back."""
        self.start_time = time.monotonic()
        previous = workflow.received_signal
        workflow.received_signal = signal
        # After on_timeout="run" (docs/MANUAL.md, "Time-bounded waits"); the class attribute says False everywhere else.
        if execution.timed_out_at is not None:
            workflow.wait_timed_out = True
        self.session.info.pop(_WROTE, None)
        _watch.session = self.session
        try:
            with executing(workflow):
                workflow.before_step_execution(execution)
                result: Result = workflow.around_step_execution(
                    execution, lambda: self.execute_step(workflow, execution, step_def)
                )
                workflow.after_step_execution(execution)
        finally:
            _watch.session = None
            workflow.received_signal = previous
            workflow.__dict__.pop("wait_timed_out", None)
        return result

    def execute_step(
        self, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
    ) -> Result:
        with instrument("step", self._payload(workflow, execution)) as payload:
            if execution.started_at is not None:
                # Queue and dispatch lag (geneva_drive_step_start_delay_seconds).
                delay = execution.started_at - execution.scheduled_for
                payload["start_delay"] = delay.total_seconds()
            result: Result
            try:
                if not step_def.resumable:
                    step_def.run(workflow)
                    result = Completed()
                else:
                    iterable = IterableStep(step_def.name, execution, executor=self)
                    try:
                        step_def.run(workflow, iterable)
                        result = Completed()
                    except Interrupt as interrupt:
                        result = Interruption(interrupt.wait)
            except FlowInterrupt as signal:
                result = signal
            except Exception as error:
                result = Captured(error)
            if isinstance(result, Completed):
                payload["outcome"] = "completed"
            elif isinstance(result, Interruption):
                payload["outcome"] = "interrupted"
                payload["wait"] = result.wait
            elif isinstance(result, FlowInterrupt):
                payload["outcome"] = result.action.value
            else:
                payload["outcome"] = "exception"
                payload["exception"] = result.error
            return result

    def should_interrupt(self, iterations: int) -> bool:
        """Called at every resumable checkpoint."""
        if not self.interruptible:
            return False
        step_def = self.step_def
        limit = (
            self.max_iterations
            if self.max_iterations is not None
            else (step_def.max_iterations if step_def else None)
        )
        if limit is not None and iterations >= limit:
            return True
        if step_def is not None and step_def.max_runtime is not None:
            if time.monotonic() - self.start_time > step_def.max_runtime.total_seconds():
                return True
        if shutdown_requested():
            return True
        return not self._still_running()

    def _still_running(self) -> bool:
        """Is this execution still in progress and the one its workflow is performing?

        Not "is the workflow paused": an operator's skip(), resume_at() or cancel() after a
        pause leaves the workflow ready (or canceled) with this execution closed, and resume_at
        has queued another step that may already run elsewhere.
        """
        row = self.session.execute(
            select(Workflow.state, StepExecution.state)
            .join(StepExecution, StepExecution.workflow_id == Workflow.id)
            .where(StepExecution.id == self.execution_id)
        ).first()
        return row is not None and is_still_running(row[0], row[1])

    # --- phase 3 ---------------------------------------------------------------------------

    def finalize(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        result: Result,
        *,
        body_wrote: bool = False,
    ) -> None:
        locked = self._lock_reconnecting(body_wrote=body_wrote)
        wrote = body_wrote and self.lost is None
        if locked is None:
            if wrote:
                self.session.rollback()  # nothing to record them with
            self.log.warning("step execution vanished before finalize (workflow deleted?)")
            return
        workflow, execution = locked
        if wrote and _discarded(workflow, execution):
            # The attempt is discarded: its writes roll back before its outcome is recorded.
            # That ends this transaction and its locks; the rows are locked and read again.
            self.session.rollback()
            locked = self._lock_reconnecting()
            if locked is None:
                self.log.warning("step execution vanished before finalize (workflow deleted?)")
                return
            workflow, execution = locked
            if not _discarded(workflow, execution):
                # Paused, then resumed between the two locks: the step counts as running again,
                # but its writes are gone. It runs again, as after a pause it would have.
                self._rerun_discarded(workflow, execution, step_def)
                return
        payload = self._payload(workflow, execution)
        with instrument("finalize", payload):
            if execution.state != StepState.IN_PROGRESS:
                if execution.outcome == Outcome.RECOVERED and execution.worker_id is not None:
                    # This worker's lease expired while the step ran (a stall, a lost
                    # connection): another sweep recovered it, and the step runs (or ran)
                    # again elsewhere. This attempt and its writes are discarded.
                    self.log.warning(
                        "worker %s lost its lease while the step ran: execution %s was "
                        "recovered meanwhile; this attempt and its writes are discarded",
                        current_worker.name_of(execution.worker_id) or f"#{execution.worker_id}",
                        execution.id,
                    )
                    return
                self.log.warning(
                    "execution is %s (changed while the step ran); leaving it alone",
                    execution.state,
                )
                return
            if workflow.state != WorkflowState.PERFORMING:
                self.log.warning("workflow is %s (changed while the step ran)", workflow.state)
                # A resumable step keeps its cursor for resume(): stopped at a checkpoint, or
                # finished its last item after an operator paused the performing workflow.
                if (
                    workflow.state == WorkflowState.PAUSED
                    and step_def.resumable
                    and isinstance(result, Interruption | Completed)
                ):
                    complete_execution(execution, Outcome.WORKFLOW_PAUSED)
                elif (
                    workflow.state == WorkflowState.PAUSED
                    and step_def.resumable
                    and isinstance(result, Captured)
                ):
                    # It failed after the pause: keep the error and the last checkpoint, so
                    # resume() continues from the cursor (as after the pause policy).
                    write_error(execution, result.error)
                    fail_execution(execution)
                else:
                    cancel_execution(execution)
                return
            # The workflow's transition out of performing clears current_step_name; the step
            # that ran stays the reference for scheduling through ``current``.
            self.current = workflow.current_step_name or step_def.name
            if self.lost is not None and not isinstance(result, Captured):
                result = Captured(self._connection_lost_error(workflow, execution))
            self._apply_result(workflow, execution, step_def, result)
            if self.error is None:
                payload["workflow_state"] = workflow.state
                payload["step_state"] = execution.state

    def _connection_lost_error(
        self, workflow: Workflow, execution: StepExecution
    ) -> DatabaseConnectionLostError:
        lost = self.lost
        error = DatabaseConnectionLostError(
            f"The database connection was lost ({lost.orig if lost else 'disconnect'}) after "
            f"step '{execution.step_name}' of {type(workflow).__name__} #{workflow.id} wrote "
            "through self.session; those writes were rolled back with it, so this attempt "
            "failed instead of succeeding without them. The exception policy decides what "
            "follows (match DatabaseConnectionLostError to reattempt; resume() runs the step "
            "again).",
            step_execution=execution,
            workflow=workflow,
        )
        error.__cause__ = lost
        return error

    def _rerun_discarded(
        self, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
    ) -> None:
        """The attempt's writes were rolled back as discarded, but the workflow runs this step
        again meanwhile: record it as reattempted (not counted against a policy's
        ``max_reattempts``) and schedule the step once more."""
        self.current = workflow.current_step_name or step_def.name
        decision = decide(Cause.STEP, FlowAction.REATTEMPT)
        self._apply(workflow, execution, step_def, decision, reason="discarded")
        self.log.warning("the step's writes were discarded; it runs again")

    def _apply_result(
        self, workflow: Workflow, execution: StepExecution, step_def: StepDefinition, result: Result
    ) -> None:
        if isinstance(result, Captured):
            self.handle_policy(workflow, execution, step_def, result.error, "exception_policy")
            return
        wait: timedelta | None = None
        if isinstance(result, Completed):
            decision = decide(Cause.STEP, Action.COMPLETED)
        elif isinstance(result, Interruption):
            decision = decide(Cause.STEP, Action.INTERRUPTED)
            wait = result.wait
        else:
            decision = decide(Cause.STEP, result.action, resumable=step_def.resumable)
            wait = result.wait
            if decision.reattempts and step_def.resumable and result.options.get("rewind"):
                execution.cursor = None
        self._apply(workflow, execution, step_def, decision, wait=wait, reason="flow_control")

    def _apply(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        decision: Decision,
        *,
        wait: timedelta | None = None,
        error: Exception | None = None,
        reason: str,
    ) -> None:
        """Record ``decision`` (engine/outcomes.py): close the execution, then move the workflow
        once and schedule what follows. ``reason`` is a reattempt's ``reattempt_reason``."""
        # The execution held the workflow's one current slot while in progress: once it is
        # closed no stray execution can exist, and the last step's finish need not sweep.
        was_running = execution.state == StepState.IN_PROGRESS
        if decision.records_error and error is not None:
            write_error(execution, error)
        outcome = decision.outcome if decision.outcome is not None else run_outcome(execution)
        transition_step(execution, decision.step_state, outcome)
        if decision.reattempts:
            if error is None:
                execution.merge_metadata(reattempt_reason=reason)
            else:
                execution.merge_metadata(reattempt_reason=reason, exception=exception_info(error))
        if decision.resolves_signal:
            signals.resolve_attached(self.session, execution)
        self._follow(workflow, execution, step_def, decision, wait, sweep=not was_running)

    def _follow(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition | None,
        decision: Decision,
        wait: timedelta | None,
        *,
        sweep: bool = True,
    ) -> None:
        """The workflow's one transition for ``decision``, and the execution that follows."""
        session = self.session
        follow = decision.follow
        if follow == Follow.NEXT_STEP:
            following = scheduling.following_step(workflow, self.current)
            if following is None:
                # Out of steps: finished straight from performing, not through ready.
                scheduling.finish_workflow(session, workflow, sweep=sweep)
                return
            workflow_ready(workflow)
            scheduling.create_step_execution(
                session, workflow, following, wait if wait is not None else following.wait
            )
            return
        transition_workflow(workflow, decision.workflow_state)
        resumable = step_def is not None and step_def.resumable
        if follow == Follow.SUCCESSOR or (follow == Follow.SAME_STEP and resumable):
            scheduling.create_successor_execution(session, workflow, execution, wait)
        elif follow == Follow.SAME_STEP:
            scheduling.reschedule_current_step(session, workflow, wait, current=self.current)

    # --- exception policies -------------------------------------------------------------------

    def resolve(
        self,
        workflow: Workflow,
        step_def: StepDefinition | None,
        step_name: str,
        error: Exception,
    ) -> PolicyResult:
        stack = resolution_stack(
            step_def.exception_policy if step_def is not None else None,
            type(workflow)._exception_policies,
        )
        count = consecutive_reattempt_count(self.session, workflow, step_name)
        with executing(workflow):
            result = stack.apply(error, count, workflow)
        return result if result is not None else PolicyResult("pause", error)

    def report(
        self, workflow: Workflow, execution: StepExecution, error: Exception, result: PolicyResult
    ) -> None:
        if result.report == "never":
            return
        if result.report == "terminal_only" and not result.terminal:
            return
        if error is self.reported:
            return
        self.reported = error
        report_error(error, self._context(workflow, execution))

    def handle_policy(
        self,
        workflow: Workflow,
        execution: StepExecution,
        step_def: StepDefinition,
        error: Exception,
        reason: str,
    ) -> None:
        """Resolve, report and apply the policy for a body or precondition exception."""
        result = self.resolve(workflow, step_def, step_def.name, error)
        self.report(workflow, execution, error, result)
        self._apply(
            workflow,
            execution,
            step_def,
            result.decision,
            wait=result.wait,
            error=error,
            reason=reason,
        )
        self.log.info("%s raised %s; policy %s", reason, type(error).__name__, result.action)
        self.error = error


__all__ = [
    "Executor",
    "StepConfigurationError",
    "clear_shutdown",
    "consecutive_reattempt_count",
    "execute",
    "request_shutdown",
]
