"""Fan-out and join: child workflows (docs/MANUAL.md, "Fan-out and join: child workflows").

A step starts children with ``self.start_child(ShipLineWorkflow, hero=line)``; a later step
with ``wait_for_children=True`` parks until every child started before it has ended.

How the join stays race-free, crash-safe and O(1) per child:

* The parent row carries two counters (migration 0009): ``children_open`` (started, not yet
  ended) and ``children_canceled`` (ended canceled since the last join). The children a step
  starts are added to ``children_open`` in the step's own transaction, in one UPDATE when it
  commits (:mod:`geneva_drive.at_commit`): an attempt that is discarded, fails or dies rolls
  the children and the count back together, and a savepoint of the step's that rolls back
  takes its children's share with it. (One UPDATE per child cost PostgreSQL a walk of the
  row's growing chain of versions each time: 10,000 children in one step took 66 s.)
* A child's end (finished or canceled, whoever ended it) reaches its parent in the child's
  ending transaction, under the parent's row lock: one signal row
  ``geneva_drive.child_ended`` with the child's id as its idempotency key (the signal dedup
  index: one per child, ever), and one UPDATE of the counters. A crash before that
  transaction commits loses both the child's end and its report; after, both are durable.
* The join's gate (the executor's prepare, under the parent's lock) parks while
  ``children_open > 0``; the child whose end brings it to 0 wakes the parked execution, under
  the same lock. Whichever of the two commits first, the other sees it: no lost wake-up, no
  double one, and no step ever counts the children.

The child-end signals are stored already consumed (the counters consumed them): they are the
parent's audit trail of its children's ends, and never wait in the signal inbox or meet a
``wait_for=`` step's matcher.

Lock order: a child's end locks the child, then its parent; a step that starts children locks
its own row before inserting the first one (``_lock_parent``); ``cancel_children`` locks the
parent, then its children. A child ending at the very moment its parent is canceled can
therefore deadlock on PostgreSQL or MariaDB; the database aborts one of the two transactions
(the executor's finalize runs again, or, when the step's body wrote, housekeeping's stuck
recovery runs the step again; an operator's cancel reports the error) and nothing
half-written remains.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, bindparam, func, inspect, select, update
from sqlalchemy.orm import Session, object_session

from geneva_drive import db, scheduling, transitions
from geneva_drive.at_commit import AtCommit
from geneva_drive.compiled import Compiled
from geneva_drive.dialects import Dialect, dialect_for
from geneva_drive.errors import InvalidInputError, InvalidStateError
from geneva_drive.instrumentation import ContextAdapter, child_joined, child_started
from geneva_drive.models import Base, StepExecution, utcnow
from geneva_drive.states import (
    ONGOING_WORKFLOW_STATES,
    TERMINAL_WORKFLOW_STATES,
    ChildFailureAction,
    SignalState,
    StepState,
    WorkflowState,
)

if TYPE_CHECKING:
    from geneva_drive.steps import StepDefinition
    from geneva_drive.workflow import Workflow

log = logging.getLogger("geneva_drive.children")

#: The name of the signal a child's end delivers to its parent (one per child).
CHILD_ENDED = "geneva_drive.child_ended"
#: ``error_class_name`` of a join execution ended by ``on_child_failure`` (pause or cancel).
CHILD_CANCELED = "geneva_drive.errors.ChildWorkflowCanceled"

#: The parents whose cancellation is canceling their children right now: those children's
#: ends are not reported back (their parent is ending; its counters no longer matter).
_cascading: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "geneva_drive_cascading", default=frozenset()
)


def _workflows() -> Table:
    return Base.metadata.tables["geneva_drive_workflows"]


def _signals() -> Table:
    return Base.metadata.tables["geneva_drive_signals"]


def _locking(session: Session, query: Any) -> Any:
    """``query`` under row locks where the database has them (``FOR UPDATE``); SQLite's write
    lock (``db.begin_write``) already serializes."""
    return dialect_for(session).lock(query)


def _base(workflow: Workflow) -> type[Workflow]:
    """``geneva_drive.workflow.Workflow``, reached through a loaded instance (this module sits
    below the DSL that imports it)."""
    cls: type[Workflow] = inspect(workflow).mapper.base_mapper.class_
    return cls


# --- starting ----------------------------------------------------------------------------------


def start_child(parent: Workflow, cls: type[Workflow], hero: Any = None, **options: Any) -> Any:
    """``wf.start_child(cls, hero=..., **create_options)``: create a child in the step's
    transaction (``cls.create``'s rules: one ongoing per hero unless ``allow_multiple``)."""
    if not parent._in_step():
        raise InvalidStateError(
            f"start_child() starts a child from inside a step of its parent; "
            f"{type(parent).__name__} #{parent.id} is not running a step here. To start a "
            f"workflow on its own, use {getattr(cls, '__name__', cls)}.create()"
        )
    if "session" in options:
        raise InvalidInputError(
            "start_child() creates the child in the parent step's own session; remove session="
        )
    session = scheduling.session_of(parent)
    key = session.identity_key(instance=parent)
    if key not in _locked.items(session):
        _lock_parent(session, parent.id)
        _locked.add(session, key)
    # Counted before the child exists: a child with no steps finishes inside create() and
    # reports its end at once.
    _started.add(session, (key, 1))
    try:
        child = cls.create(hero=hero, session=session, _parent=parent, **options)
    except BaseException:
        _started.add(session, (key, -1))
        raise
    if child_started.receivers:
        child_started.send(
            "engine",
            workflow_id=parent.id,
            workflow_type=parent.type,
            child_id=child.id,
            child_type=child.type,
        )
    return child


def _lock_parent(session: Session, parent_id: int) -> None:
    """The parent's row lock, taken before the transaction's first child is inserted.

    The child's foreign key to its parent takes a shared lock on the parent's row (InnoDB),
    and the counter UPDATE at the commit must upgrade it. A sibling ending in between queues
    for the exclusive lock (its report, ``_report_end``) behind that shared one: each waits for
    the other, and MariaDB aborts the sibling's end. Taken exclusive first, the sibling's end
    waits for this transaction's commit instead: the lock order workflow row, then its
    children's rows, that ``cancel_children`` keeps too."""
    db.begin_write(session)
    w = _workflows()
    session.execute(_locking(session, select(w.c.id).where(w.c.id == parent_id)))


#: The parents whose row this transaction has locked (``_lock_parent``): once per transaction.
#: A savepoint that rolls back drops its entries, so the next start locks again (PostgreSQL
#: releases a lock taken inside a rolled-back savepoint).
_locked: AtCommit[Any] = AtCommit("geneva_children_locked")

#: One child started (+1), or a start that failed (-1): the parent's identity key and the count.
Started = tuple[Any, int]


def _add_started(session: Session, started: list[Started]) -> None:
    """At the commit of the transaction that started them: each parent's children, in one
    UPDATE of its counter."""
    table = _workflows()
    for key, n in _per_parent(started).items():
        if n:
            session.execute(
                update(table)
                .where(table.c.id == key[1][0])
                .values(children_open=table.c.children_open + n)
            )
            loaded = session.identity_map.get(key)
            if loaded is not None:
                session.expire(loaded, ["children_open"])


def _per_parent(started: list[Started]) -> dict[Any, int]:
    totals: dict[Any, int] = {}
    for key, n in started:
        totals[key] = totals.get(key, 0) + n
    return totals


#: The children each transaction started, added to their parents' counters at its commit.
_started: AtCommit[Started] = AtCommit("geneva_children_started", write=_add_started)


# --- a child's end -----------------------------------------------------------------------------


def workflow_ended(workflow: Workflow) -> None:
    """Called by :mod:`geneva_drive.transitions` when a workflow with a parent, or whose class
    has ``cancel_children``, enters ``finished`` or ``canceled``. The caller holds the
    workflow's lock and owns the transaction."""
    session = object_session(workflow)
    if session is None:
        return
    if workflow.state == WorkflowState.CANCELED and type(workflow).cancel_children:
        _cancel_children(session, workflow)
    parent_id = workflow.parent_id
    if parent_id is not None and parent_id not in _cascading.get():
        _report_end(session, workflow, parent_id)


@dataclass(frozen=True)
class _Report:
    """The three statements of a child's end, compiled once per database (a fan-out of 10,000
    children runs them 10,000 times; SQLAlchemy's execute path cost more Python than the
    database's work)."""

    parent: Compiled
    signal: Compiled
    counters: Compiled


@functools.cache
def _report(dialect: Dialect) -> _Report:
    w = _workflows()
    s = _signals()
    parent = select(w.c.state, w.c.type, w.c.children_open).where(w.c.id == bindparam("parent_id"))
    now = bindparam("now", type_=w.c.updated_at.type)
    return _Report(
        parent=Compiled(dialect.lock(parent)),
        # The signal dedup index (one per child, ever) decides "reported already": nothing
        # inserted, rowcount 0.
        signal=Compiled(
            dialect.insert_unless_duplicate(s).values(
                workflow_id=bindparam("parent_id"),
                name=CHILD_ENDED,
                idempotency_key=bindparam("key"),
                state=SignalState.CONSUMED,
                payload=bindparam("payload", type_=s.c.payload.type),
                claimed=1,
                consumed=1,
                claimed_at=now,
                consumed_at=now,
                created_at=now,
                updated_at=now,
            )
        ),
        counters=Compiled(
            update(w)
            .where(w.c.id == bindparam("parent_id"))
            .values(
                children_open=w.c.children_open - 1,
                children_canceled=w.c.children_canceled + bindparam("canceled"),
                updated_at=now,
            )
        ),
    )


def _report_end(session: Session, child: Workflow, parent_id: int) -> None:
    db.begin_write(session)
    statements = _report(dialect_for(session))
    connection = session.connection()
    row = statements.parent.first(connection, {"parent_id": parent_id})
    if row is None:
        return  # deleted: nobody waits for this child any more
    parent_state, parent_type, children_open = row
    if parent_state in TERMINAL_WORKFLOW_STATES:
        return  # ended: nobody waits for this child any more
    canceled = child.state == WorkflowState.CANCELED
    now = utcnow()
    inserted = statements.signal.execute(
        connection,
        {
            "parent_id": parent_id,
            "key": str(child.id),
            "payload": {"child_id": child.id, "workflow": child.type, "state": child.state},
            "now": now,
        },
    )
    if not inserted:
        return  # reported already: exactly once
    statements.counters.execute(
        connection, {"parent_id": parent_id, "canceled": 1 if canceled else 0, "now": now}
    )
    _expire_loaded(session, _base(child), parent_id)
    # Without the children this transaction started, if it is the parent's own step (its
    # counter gets them at the commit): then the parent is performing, and not woken here.
    open_now = int(children_open) - 1
    if child_joined.receivers:
        child_joined.send(
            "engine",
            workflow_id=parent_id,
            workflow_type=parent_type,
            child_id=child.id,
            child_type=child.type,
            state=child.state,
        )
    if open_now <= 0 and parent_state == WorkflowState.READY:
        _wake(session, _base(child), parent_id)


def _expire_loaded(session: Session, base: type[Workflow], parent_id: int) -> None:
    loaded = session.identity_map.get(session.identity_key(base, parent_id))
    if loaded is not None:
        session.expire(loaded, ["children_open", "children_canceled"])


def _wake(session: Session, base: type[Workflow], parent_id: int) -> None:
    """The last child ended: wake the parent's execution parked on its join, if any (a parent
    still running the step that starts them, or not yet at the join, finds 0 at its gate)."""
    execution = session.scalars(
        select(StepExecution)
        .where(StepExecution.workflow_id == parent_id, StepExecution.state == StepState.WAITING)
        .order_by(StepExecution.id)
        .limit(1)
    ).first()
    if execution is None:
        return
    parent = session.get(base, parent_id)
    if parent is None:
        return
    step_def = parent.steps.named(execution.step_name)
    if step_def is None or step_def.removed or not step_def.wait_for_children:
        return
    transitions.wake_execution(execution)
    scheduling.enqueue_execution(session, parent, execution, step_def, force=True)
    _context(parent, execution).info("the last child ended; the join runs")


def _context(workflow: Workflow, execution: StepExecution) -> logging.LoggerAdapter[Any]:
    return ContextAdapter(
        log,
        {
            "workflow": type(workflow).__name__,
            "workflow_id": workflow.id,
            "execution_id": execution.id,
            "step": execution.step_name,
        },
    )


# --- cancel_children ---------------------------------------------------------------------------


def _cancel_children(session: Session, parent: Workflow) -> None:
    """``cancel_children = True``: the parent's cancellation cancels its ongoing children (and
    theirs, where their classes say so) in the same transaction."""
    Workflow = _base(parent)

    query = (
        select(Workflow)
        .where(Workflow.parent_id == parent.id, Workflow.state.in_(list(ONGOING_WORKFLOW_STATES)))
        .order_by(Workflow.id)
    )
    query = _locking(session, query)
    token = _cascading.set(_cascading.get() | {parent.id})
    try:
        with session.no_autoflush:
            ongoing = list(session.scalars(query))
            for child in ongoing:
                current = scheduling.current_execution(session, child)
                if current is not None:
                    transitions.cancel_execution(current)
                transitions.workflow_canceled(child)
    finally:
        _cascading.reset(token)
    if ongoing:
        log.info(
            "canceled %d ongoing children of %s #%s (cancel_children)",
            len(ongoing),
            type(parent).__name__,
            parent.id,
        )


# --- the join ----------------------------------------------------------------------------------


def pass_gate(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> bool:
    """The executor's prepare, for a ``wait_for_children`` step (workflow lock held): True when
    the step runs now; False when it parked, or ``on_child_failure`` ended it."""
    if execution.timed_out_at is not None:
        return True  # on_timeout="run" fired: the body runs without waiting on
    if workflow.children_open > 0:
        transitions.park_execution(execution, None, step_def.timeout)
        _context(workflow, execution).info(
            "parked waiting for %d child workflow(s)", workflow.children_open
        )
        return False
    canceled = workflow.children_canceled
    if not canceled:
        return True
    # This join answers for these failures: the next join counts afresh.
    workflow.children_canceled = 0
    action = step_def.on_child_failure or ChildFailureAction.PAUSE
    context = _context(workflow, execution)
    if action == ChildFailureAction.CONTINUE:
        context.info("%d child workflow(s) ended canceled; on_child_failure=continue", canceled)
        return True
    message = (
        f"{canceled} child workflow(s) of {type(workflow).__name__} #{workflow.id} ended "
        f"canceled before step '{execution.step_name}' (on_child_failure=\"{action}\"). "
        f"See them at /workflows?parent={workflow.id}&state=canceled"
        + ("; resume() runs the step anyway" if action == ChildFailureAction.PAUSE else "")
    )
    execution.error_message = message
    execution.error_class_name = CHILD_CANCELED
    transitions.cancel_execution(execution)
    if action == ChildFailureAction.CANCEL:
        transitions.workflow_canceled(workflow)
    else:
        transitions.workflow_paused(workflow)
    context.warning("%s", message)
    return False


def rendezvous(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    """On resume (workflow lock held, row freshly read): a join parked while its children
    ended runs now; otherwise it stays parked."""
    if workflow.children_open > 0:
        return
    step_def = workflow.steps.named(execution.step_name)
    transitions.wake_execution(execution)
    scheduling.enqueue_execution(session, workflow, execution, step_def, force=True)


def is_join(workflow: Workflow, step_name: str) -> bool:
    """Whether ``workflow``'s step ``step_name`` (in the running code) waits for its children."""
    step_def = workflow.steps.named(step_name)
    return step_def is not None and not step_def.removed and step_def.wait_for_children


def join_steps() -> list[tuple[str, str]]:
    """``(workflow type, step name)`` of every registered join (``wait_for_children=True``),
    the old names of renamed joins included: an execution ``waiting`` on one of these waits
    for child workflows, not for a signal (the signal inbox leaves it out)."""
    from geneva_drive.registry import registered_workflows

    pairs: list[tuple[str, str]] = []
    for type_name, cls in sorted(registered_workflows().items()):
        joins = {d.name for d in cls.steps if not d.removed and d.wait_for_children}
        pairs.extend((type_name, name) for name in sorted(joins))
        renamed = cls.steps.renamed
        pairs.extend((type_name, old) for old in sorted(renamed) if renamed[old] in joins)
    return pairs


def counts(session: Session, parent_id: int) -> dict[str, int]:
    """The parent's children by state, for the dashboard's progress line (one grouped read of
    the parent_id index)."""
    table = _workflows()
    rows = session.execute(
        select(table.c.state, func.count())
        .where(table.c.parent_id == parent_id)
        .group_by(table.c.state)
    )
    return {str(state): int(count) for state, count in rows}


#: The children-summary key of a paused child whose newest execution failed: its exception
#: policy paused it (its error is the thing to fix), apart from children paused by hand.
PAUSED_AFTER_ERROR = "paused_after_error"
#: ``error_class_name`` of a step its class no longer defines: a stranded child, not an error.
_STEP_NOT_DEFINED = "geneva_drive.errors.StepNotDefinedError"


def paused_after_error(workflow_id: Any) -> Any:
    """A condition on ``workflow_id`` (a column): the workflow's newest execution failed with an
    error other than a removed step. True of a paused workflow its exception policy paused; read
    on the executions' workflow index, never the whole table."""
    executions = StepExecution.__table__
    newer = executions.alias("newer")
    return (
        select(executions.c.id)
        .where(
            executions.c.workflow_id == workflow_id,
            executions.c.state == StepState.FAILED,
            executions.c.error_class_name != _STEP_NOT_DEFINED,
            ~select(newer.c.id)
            .where(newer.c.workflow_id == executions.c.workflow_id, newer.c.id > executions.c.id)
            .exists(),
        )
        .exists()
    )


def summaries(session: Session, parent_ids: list[int]) -> dict[int, dict[str, int]]:
    """``{parent_id: {state: n}}``: each parent's children by state, with the paused ones that
    failed counted apart under :data:`PAUSED_AFTER_ERROR` (and not again under ``paused``).

    Two grouped reads of the parent_id index, whatever the number of parents: the why-lines of
    a page of parents and a parent's detail use it (docs/MANUAL.md, "What operators see").
    """
    if not parent_ids:
        return {}
    table = _workflows()
    found: dict[int, dict[str, int]] = {}
    rows = session.execute(
        select(table.c.parent_id, table.c.state, func.count())
        .where(table.c.parent_id.in_(parent_ids))
        .group_by(table.c.parent_id, table.c.state)
    )
    for parent_id, state, count in rows:
        found.setdefault(int(parent_id), {})[str(state)] = int(count)
    paused = [p for p, by_state in found.items() if by_state.get(WorkflowState.PAUSED)]
    if paused:
        failed = session.execute(
            select(table.c.parent_id, func.count())
            .where(
                table.c.parent_id.in_(paused),
                table.c.state == WorkflowState.PAUSED,
                paused_after_error(table.c.id),
            )
            .group_by(table.c.parent_id)
        )
        for parent_id, count in failed:
            by_state = found[int(parent_id)]
            by_state[PAUSED_AFTER_ERROR] = int(count)
            by_state[WorkflowState.PAUSED] -= int(count)
            if not by_state[WorkflowState.PAUSED]:
                del by_state[WorkflowState.PAUSED]
    return found


transitions.on_workflow_end(workflow_ended)

__all__ = [
    "CHILD_CANCELED",
    "CHILD_ENDED",
    "PAUSED_AFTER_ERROR",
    "counts",
    "is_join",
    "join_steps",
    "pass_gate",
    "paused_after_error",
    "rendezvous",
    "start_child",
    "summaries",
    "workflow_ended",
]
