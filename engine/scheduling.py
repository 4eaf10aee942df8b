"""Creating step executions and handing them to the transport.

Every function here runs inside the caller's transaction, with the workflow lock taken by
:func:`lock_workflow`. ``create_step_execution`` is the only "normal" scheduler; every path
that creates an execution first sweeps stray scheduled/waiting executions of the workflow, so
at most one is ever current (the partial unique index covers scheduled and in_progress; the
sweep covers waiting).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from geneva_drive import db, inline, limits, persistence, tracing, transitions
from geneva_drive.config import settings
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import StepNotDefinedError, UsageError
from geneva_drive.job_options import merge
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import CURRENT_STEP_STATES, STRAY_STEP_STATES
from geneva_drive.transport import Message, new_job_id, queue_message

if TYPE_CHECKING:
    from geneva_drive.steps import StepDefinition
    from geneva_drive.workflow import Workflow


def session_of(workflow: Workflow) -> Session:
    session = object_session(workflow)
    if session is None:
        raise UsageError(
            f"{type(workflow).__name__} #{workflow.id} is not attached to a session; load it "
            "through a session (session.get(...)) before calling workflow methods"
        )
    return session


def lock_workflow(session: Session, workflow: Workflow) -> Workflow:
    """Take the workflow row lock (FOR UPDATE; the write lock on SQLite) and reload the row."""
    db.begin_write(session)
    session.flush()
    dialect_for(session).refresh_locked(session, workflow)
    return workflow


def current_execution(session: Session, workflow: Workflow) -> StepExecution | None:
    return session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.state.in_(list(CURRENT_STEP_STATES)),
        )
        .order_by(StepExecution.id)
        .limit(1)
    ).first()


def cancel_stray_executions(session: Session, workflow: Workflow) -> None:
    """Cancel every scheduled or waiting execution of the workflow (the "stray" sweep).

    A prebuilt Core UPDATE on the (workflow_id, state) index: no autoflush, no ORM
    bookkeeping. (Scheduling a new execution sweeps through ``persistence.insert_execution``
    instead, together with the writes before it.) Loaded copies of the swept rows are expired
    so the next access reads the new state.
    """
    persistence.sweep_strays(session, workflow.id, utcnow())
    expire_swept(session, workflow)


def expire_swept(
    session: Session, workflow: Workflow, inserted: StepExecution | None = None
) -> None:
    """Loaded copies of the workflow's executions the sweep just canceled read their new
    state at their next access (``inserted``, the row inserted after the sweep, is not one)."""
    for obj in list(_loaded_strays(session, workflow, inserted)):
        session.expire(obj, list(transitions.SWEPT_ATTRIBUTES))


def _loaded_strays(
    session: Session, workflow: Workflow, inserted: StepExecution | None = None
) -> Iterator[StepExecution]:
    for obj in list(session.identity_map.values()):
        if (
            isinstance(obj, StepExecution)
            and obj is not inserted
            and obj.workflow_id == workflow.id
            and obj.state in STRAY_STEP_STATES
            and obj not in session.new
        ):
            yield obj


def _strays_loaded(session: Session, workflow: Workflow) -> bool:
    """Whether the session holds a copy of an execution the sweep would cancel: a deferred
    INSERT (and its sweep) must not wait then, or the copy would be expired before its row
    changed, and read back unchanged."""
    return any(True for _obj in _loaded_strays(session, workflow))


def job_options_for(workflow: Workflow, step_def: StepDefinition | None) -> dict[str, Any]:
    """Class < instance < step."""
    return merge(
        type(workflow).class_step_job_options(),
        workflow.step_job_options,
        step_def.job_options if step_def is not None else None,
    )


def plan(
    workflow: Workflow,
    step_def: StepDefinition | None,
    scheduled_for: datetime,
    *,
    force: bool = False,
) -> tuple[Message | None, datetime]:
    """Decide whether an execution due at ``scheduled_for`` is sent at commit: the message (or
    None), and the time the row must be due at when no message is sent.

    Executions due within the dispatch horizon get a message (with a countdown); later ones
    get none and keep ``sent_at`` NULL until the dispatcher finds them due. ``force`` sends
    regardless of ``scheduled_for`` (the dispatcher and ``resume()`` use it for due work).
    Configured ``wait``/``wait_until`` job options within the horizon delay the message
    without changing ``scheduled_for``, as in the gem.

    No message ever carries a countdown beyond the dispatch horizon: a worker would hold it in
    memory and Redis would redeliver it past its visibility timeout (docs/MANUAL.md, "The row is the schedule; Celery is only the transport"). A ``wait`` or
    ``wait_until`` job option that lies beyond the horizon is therefore held like a far
    ``scheduled_for``: the second value is that later time, which the caller writes into
    ``scheduled_for``, so the dispatcher sends the row when it is near. On a forced send a
    ``wait`` longer than the horizon is not applied again: the row's ``scheduled_for`` already
    holds it (re-applying a relative wait at each send would postpone the step forever).
    """
    now = utcnow()
    horizon = settings.dispatch_horizon.total_seconds()
    options = job_options_for(workflow, step_def)
    # When the job options say the step may run (None: they do not delay it).
    option_due: datetime | None = None
    wait_until = options.get("wait_until")
    if wait_until is not None:
        if not isinstance(wait_until, datetime):
            wait_until = datetime.fromtimestamp(float(wait_until), UTC)
        option_due = wait_until
    wait = options.get("wait")
    if wait is not None:
        extra = wait if isinstance(wait, timedelta) else timedelta(seconds=float(wait))
        if not (force and extra.total_seconds() > horizon):
            option_due = max(option_due, now + extra) if option_due else now + extra
    due_at = max(scheduled_for, option_due) if option_due is not None else scheduled_for
    delay = (due_at - now).total_seconds()
    if delay > horizon:
        # Forced sends are for rows the caller found due (the dispatcher, a woken signal
        # waiter): only a job option can hold those back.
        option_holds = option_due is not None and (option_due - now).total_seconds() > horizon
        if not force or option_holds:
            return None, due_at
    return (
        Message(
            execution_id=0,
            job_id=new_job_id(),
            queue=options.get("queue"),
            priority=options.get("priority"),
            countdown=delay if delay > 0 else None,
            options=options,
            trace=tracing.stored(workflow.metadata_),
        ),
        scheduled_for,
    )


def enqueue_execution(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition | None,
    *,
    force: bool = False,
) -> Message | None:
    """Queue an existing execution's message for after commit (resume, dispatcher, wake).

    A job option that holds the step beyond the dispatch horizon (:func:`plan`) sends nothing:
    the row's ``scheduled_for`` moves to that time and it stays unsent for the dispatcher.
    """
    message, due_at = plan(workflow, step_def, execution.scheduled_for, force=force)
    if message is None:
        if due_at > execution.scheduled_for:
            execution.scheduled_for = due_at
            execution.sent_at = None
        return None
    message.execution_id = execution.id
    execution.job_id = message.job_id
    execution.sent_at = utcnow()
    queue_message(session, message)
    return message


def _insert_execution(
    session: Session,
    workflow: Workflow,
    step_def: StepDefinition | None,
    step_name: str,
    wait: timedelta | None,
    *,
    fresh: bool = False,
    **columns: Any,
) -> StepExecution:
    now = utcnow()
    scheduled_for = now + wait if wait is not None else now
    message, held_until = plan(workflow, step_def, scheduled_for)
    # A job option beyond the horizon: the row carries the time, not a message (see plan()).
    scheduled_for = max(scheduled_for, held_until)
    if message is not None and inline.take(
        session, message, continuation="continues_from_id" in columns
    ):
        # This worker runs the execution itself once this transaction commits (engine/
        # inline.py): inserted unsent, so the dispatcher sends it if the worker dies first.
        held, message = message, None
    else:
        held = None
    limited = limits.has_limits(workflow, step_def)
    if limited:
        # Keys are evaluated now and stored on the row (docs/MANUAL.md, "Concurrency and rate limits"); unlimited steps skip this.
        columns.update(limits.columns(workflow, step_def))
    deferred_id = None
    if held is not None and not fresh and not limited:
        # The executor may start this successor before its commit: then its row is
        # inserted started, with its predecessor's outcome (persistence.write_deferred).
        deferred_id = inline.deferred_id(session, workflow, step_def)
        if deferred_id is not None and _strays_loaded(session, workflow):
            deferred_id = None
    transitions.point_at(workflow, step_name)
    # One Core INSERT (the changes made so far are written first, by Core UPDATEs): the unit
    # of work would cost more than the rest of the step (engine/persistence.py). Before it,
    # the workflow's stray executions are swept - not for a workflow inserted in this very
    # call, which has none - on PostgreSQL in the same statement as the writes and the INSERT.
    execution = persistence.insert_execution(
        session,
        sweep=None if fresh else (workflow.id, utcnow()),
        deferred_id=deferred_id,
        workflow_id=workflow.id,
        step_name=step_name,
        **transitions.new_execution_columns(scheduled_for),
        # A held row gets its job id too (inline rows look like published ones); with no
        # sent_at it is the creating worker's to claim, and the dispatcher leaves it alone for
        # one dispatch_interval (engine/dispatch.py) before it sends it as a lost hand-off.
        job_id=message.job_id if message else (held.job_id if held else None),
        sent_at=now if message else None,
        **columns,
    )
    if not fresh and deferred_id is None:  # deferred: no stray was loaded (checked above)
        expire_swept(session, workflow, inserted=execution)
    if message is not None:
        message.execution_id = execution.id
        queue_message(session, message)
    elif held is not None:
        inline.bind(session, execution)
    return execution


def create_step_execution(
    session: Session,
    workflow: Workflow,
    step_def: StepDefinition,
    wait: timedelta | None,
    *,
    fresh: bool = False,
) -> StepExecution:
    """``fresh``: the workflow was inserted by this call (``Workflow.create``), so no stray
    execution can exist and the sweep is skipped."""
    return _insert_execution(session, workflow, step_def, step_def.name, wait, fresh=fresh)


def create_successor_execution(
    session: Session, workflow: Workflow, predecessor: StepExecution, wait: timedelta | None = None
) -> StepExecution:
    """The next link of a resumable chain: same step, the predecessor's cursor and signal pin.

    The link takes the step's current name: a chain begun before ``renamed_step`` continues
    under the new name (docs/MANUAL.md, "Changing workflows in production": scheduling never uses the old name again). Without a
    definition the stored name is kept, so the stranded link stays visible under it."""
    step_def = workflow.steps.named(predecessor.step_name)
    return _insert_execution(
        session,
        workflow,
        step_def,
        step_def.name if step_def is not None else predecessor.step_name,
        wait,
        continues_from_id=predecessor.id,
        cursor=predecessor.cursor,
        signal_id=predecessor.signal_id,
    )


def finish_workflow(session: Session, workflow: Workflow, *, sweep: bool = True) -> None:
    """The workflow ran out of steps: finished, with no step pointers.

    A finished workflow keeps no live execution. Normally the one that ran is closed already;
    an operator skip of a paused workflow's last step leaves the preserved scheduled or parked
    execution, which the next create would sweep - there is no next create here.
    ``sweep=False``: the caller has just closed the workflow's in-progress execution (the
    executor's finalize), which held its one current slot, so no stray exists to sweep.
    """
    if sweep:
        cancel_stray_executions(session, workflow)
    transitions.workflow_finished(workflow, out_of_steps=True)
    persistence.flush(session)  # Core UPDATEs, not the unit of work (engine/persistence.py)


def reference_step_name(workflow: Workflow, current: str | None = None) -> str | None:
    """The step scheduling counts from: the running step, else the last scheduled one."""
    return current or workflow.current_step_name or workflow.next_step_name


def following_step(workflow: Workflow, current: str | None = None) -> StepDefinition | None:
    """The runnable step after the reference step (None: the workflow is out of steps)."""
    return workflow.steps.next_after(reference_step_name(workflow, current))


def schedule_next_step(
    session: Session,
    workflow: Workflow,
    wait: timedelta | None = None,
    *,
    current: str | None = None,
) -> StepExecution | None:
    """Schedule the runnable step after the reference step, or finish the workflow.

    ``current`` names the step that just ran when the caller has already cleared
    ``current_step_name`` (the executor does, so the workflow row is written once).
    """
    following = following_step(workflow, current)
    if following is None:
        finish_workflow(session, workflow)
        return None
    return create_step_execution(
        session, workflow, following, wait if wait is not None else following.wait
    )


def reschedule_current_step(
    session: Session,
    workflow: Workflow,
    wait: timedelta | None = None,
    *,
    current: str | None = None,
) -> StepExecution:
    """Run the current step again; only the given wait counts (the step's own is not reapplied)."""
    name = reference_step_name(workflow, current)
    step_def = workflow.steps.named(name)
    if step_def is None:
        raise StepNotDefinedError(
            f"Cannot reschedule {type(workflow).__name__} #{workflow.id}: step '{name}' is not "
            f"defined in {type(workflow).__name__}",
            workflow=workflow,
        )
    return create_step_execution(session, workflow, step_def, wait)
