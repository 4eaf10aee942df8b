"""Test helpers: drive workflows through the real executor, in-process, with no broker.

They commit the workflow's session first (like a worker, the executor sees only committed
rows), run executions in that same session, and reload the workflow afterwards. Semantics and
messages follow the gem's test helpers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from geneva_drive import db, executor, scheduling, timeouts, transitions
from geneva_drive.config import settings
from geneva_drive.errors import InvalidInputError, UsageError
from geneva_drive.models import Signal, StepExecution, Worker, utcnow
from geneva_drive.signal_matcher import matcher_name
from geneva_drive.states import ONGOING_WORKFLOW_STATES, StepState, WorkflowState
from geneva_drive.workflow import Workflow

__all__ = [
    "assert_cursor",
    "assert_signal_state",
    "assert_step_executed",
    "assert_step_has_successor",
    "assert_waiting_for_signal",
    "assert_workflow_state",
    "expire_wait",
    "expire_worker",
    "fire_schedules",
    "perform_next_step",
    "perform_step_inline",
    "run_iterations",
    "speedrun_children",
    "speedrun_current_step",
    "speedrun_workflow",
]


def _reload(workflow: Any) -> Session:
    session = scheduling.session_of(workflow)
    session.commit()
    session.expire_all()
    session.refresh(workflow)
    return session


def _parked_on_children(workflow: Any, execution: StepExecution) -> bool:
    definition = workflow.steps.named(execution.step_name)
    return (
        execution.state == StepState.WAITING
        and definition is not None
        and definition.wait_for_children
    )


def _raise_if_parked(workflow: Any, execution: StepExecution, helper: str) -> None:
    if execution.state != StepState.WAITING:
        return
    definition = workflow.steps.named(execution.step_name)
    if definition is not None and definition.wait_for_children:
        raise UsageError(
            f"{helper} cannot drive step '{execution.step_name}': its execution is parked "
            f"waiting for {workflow.children_open} child workflow(s). Run them first with "
            f"speedrun_children(workflow), then call {helper} again."
        )
    matcher = definition.signal_matcher if definition is not None else None
    waiting_for = f" waiting for {matcher}" if matcher is not None else ""
    name = matcher_name(matcher) if matcher is not None else None
    raise UsageError(
        f"{helper} cannot drive step '{execution.step_name}': its execution is parked"
        f"{waiting_for}. Deliver the signal first, e.g. workflow.signal({name!r}), then call "
        f"{helper} again."
    )


def _run(session: Session, execution_id: int, **kwargs: Any) -> None:
    # Like a worker: the executor gets its own session, so the step sees a freshly loaded
    # workflow (attributes a previous step set on ``self`` are gone, as in production) and the
    # caller's objects are refreshed from what it committed.
    session.commit()
    worker = Session(bind=session.get_bind(), expire_on_commit=False)
    try:
        executor.execute(execution_id, session=worker, **kwargs)
    finally:
        worker.close()
        session.expire_all()


def speedrun_workflow(workflow: Any, max_iterations: int = 100) -> Any:
    """Run steps until the workflow finishes, is canceled or pauses (waits are not waited).

    It never runs child workflows: at a ``wait_for_children`` step whose children have not all
    ended it stops, with the step parked; ``speedrun_children(workflow)`` runs them.
    """
    iterations = 0
    while True:
        session = _reload(workflow)
        if workflow.state in (WorkflowState.FINISHED, WorkflowState.CANCELED, WorkflowState.PAUSED):
            break
        execution = scheduling.current_execution(session, workflow)
        if execution is None or _parked_on_children(workflow, execution):
            break
        _raise_if_parked(workflow, execution, "speedrun_workflow")
        _run(session, execution.id, interruptible=False)
        iterations += 1
        if iterations >= max_iterations:
            raise UsageError(
                f"speedrun_workflow exceeded max_iterations ({max_iterations}). Workflow may be "
                "in an infinite loop."
            )
    _reload(workflow)
    return workflow


def speedrun_children(parent: Any, max_iterations: int = 100) -> list[Any]:
    """``speedrun_workflow`` each ongoing child of ``parent``, oldest first (docs/MANUAL.md, "Fan-out and join: child workflows"); their
    ends reach the parent as in production (the last one wakes a parked join). The parent's own
    steps do not run: call ``speedrun_workflow(parent)`` afterwards. Returns the children."""
    session = _reload(parent)
    children = list(
        session.scalars(
            select(Workflow)
            .where(
                Workflow.parent_id == parent.id,
                Workflow.state.in_(list(ONGOING_WORKFLOW_STATES)),
            )
            .order_by(Workflow.id)
        )
    )
    for child in children:
        speedrun_workflow(child, max_iterations=max_iterations)
    _reload(parent)
    return children


def perform_next_step(workflow: Any) -> StepExecution | None:
    """Run the current execution once (interruptible); return it (None when there is none)."""
    session = _reload(workflow)
    execution = scheduling.current_execution(session, workflow)
    if execution is None:
        return None
    _raise_if_parked(workflow, execution, "perform_next_step")
    try:
        _run(session, execution.id)
    finally:
        _reload(workflow)
    return execution


def perform_step_inline(workflow: Any, step_name: str | None = None) -> StepExecution:
    """Run one named step now (default: the next one), canceling what was scheduled."""
    session = _reload(workflow)
    name = str(step_name) if step_name is not None else workflow.next_step_name
    definition = workflow.steps.named(name)
    if definition is None:
        raise InvalidInputError(
            f"Step '{name}' is not defined in {type(workflow).__name__}. Available steps: "
            f"{', '.join(workflow.steps.names)}"
        )
    now = utcnow()
    session.execute(
        update(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.state.in_([StepState.SCHEDULED, StepState.WAITING]),
        )
        .values(**transitions.swept_columns(now))
        .execution_options(synchronize_session=False)
    )
    execution = StepExecution(
        workflow_id=workflow.id,
        step_name=definition.name,
        **transitions.new_execution_columns(now),
    )
    session.add(execution)
    session.flush()
    try:
        _run(session, execution.id)
    finally:
        _reload(workflow)
    session.refresh(execution)
    return execution


def speedrun_current_step(workflow: Any, max_executions: int = 100) -> StepExecution | None:
    """Run the current step to its end, following a resumable chain; not into the next step."""
    session = _reload(workflow)
    execution = scheduling.current_execution(session, workflow)
    if execution is None:
        return None
    original = execution.step_name
    _raise_if_parked(workflow, execution, "speedrun_current_step")
    count = 0
    while True:
        session.refresh(execution)
        _raise_if_parked(workflow, execution, "speedrun_current_step")
        if execution.state == StepState.COMPLETED:
            successor = session.scalars(
                select(StepExecution).where(StepExecution.continues_from_id == execution.id)
            ).first()
            if successor is not None:
                execution = successor
                continue
        if execution.state in (
            StepState.COMPLETED,
            StepState.FAILED,
            StepState.CANCELED,
            StepState.SKIPPED,
        ):
            break
        _run(session, execution.id, interruptible=False)
        count += 1
        if count >= max_executions:
            raise UsageError(
                f"speedrun_current_step exceeded max_executions ({max_executions}). Step "
                f"'{original}' may be in an infinite loop."
            )
    _reload(workflow)
    session.refresh(execution)
    return execution


def run_iterations(workflow: Any, count: int) -> StepExecution:
    """Run the current execution for at most ``count`` checkpoints (interruptible)."""
    session = _reload(workflow)
    execution = scheduling.current_execution(session, workflow)
    if execution is None:
        raise UsageError("No current step execution to run")
    try:
        _run(session, execution.id, max_iterations=count)
    finally:
        _reload(workflow)
    session.refresh(execution)
    return execution


def assert_step_executed(workflow: Any, step_name: str, state: str = "completed") -> None:
    session = _reload(workflow)
    found = session.scalar(
        select(StepExecution.id).where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.step_name == str(step_name),
            StepExecution.state == str(state),
        )
    )
    if found is None:
        raise AssertionError(f"Expected step '{step_name}' to be {state}, but it was not found")


def assert_workflow_state(workflow: Any, expected: str) -> None:
    _reload(workflow)
    if workflow.state != str(expected):
        raise AssertionError(f"Expected workflow to be {expected}, but was {workflow.state}")


def assert_cursor(workflow: Any, expected: Any) -> None:
    session = _reload(workflow)
    execution = scheduling.current_execution(session, workflow)
    actual = execution.cursor_value if execution is not None else None
    if actual != expected:
        raise AssertionError(f"Expected cursor {expected!r}, got {actual!r}")


def assert_step_has_successor(workflow: Any, step_name: str) -> None:
    session = _reload(workflow)
    completed = list(
        session.scalars(
            select(StepExecution)
            .where(
                StepExecution.workflow_id == workflow.id,
                StepExecution.step_name == str(step_name),
                StepExecution.state == StepState.COMPLETED,
            )
            .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        )
    )
    if not completed:
        raise AssertionError(f"Expected completed execution for step {step_name}")
    successor = None
    for execution in completed:
        successor = session.scalars(
            select(StepExecution).where(StepExecution.continues_from_id == execution.id)
        ).first()
        if successor is not None:
            break
    if successor is None:
        raise AssertionError(f"Expected successor execution for step {step_name}, but none found")
    if successor.state != StepState.SCHEDULED:
        raise AssertionError(f"Expected successor to be scheduled, but was {successor.state}")


def assert_waiting_for_signal(workflow: Any, signal_name: str | None = None) -> None:
    session = _reload(workflow)
    parked = session.scalars(
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow.id, StepExecution.state == StepState.WAITING)
        .order_by(StepExecution.created_at, StepExecution.id)
    ).first()
    if parked is None:
        current = scheduling.current_execution(session, workflow)
        state = repr(current.state) if current is not None else "nil"
        raise AssertionError(
            f"Expected {type(workflow).__name__} to be waiting for a signal, but no parked step "
            f"execution was found (current execution: {state})"
        )
    if signal_name is not None:
        definition = workflow.steps.named(parked.step_name)
        matcher = definition.signal_matcher if definition is not None else None
        if matcher_name(matcher) != str(signal_name):
            raise AssertionError(
                f"Expected step '{parked.step_name}' to be waiting for {str(signal_name)!r}, but "
                f"it waits for {matcher}"
            )


def expire_wait(workflow: Any) -> StepExecution:
    """Let the parked execution's time-out run out now and fire it, as the dispatcher would
    (docs/MANUAL.md, "Time-bounded waits"); return the execution.

    Its ``on_timeout`` is applied and committed: ``"run"`` leaves the execution scheduled (run
    it with :func:`perform_next_step`), the others close it. A paused workflow does not time
    out: its deadline passes now, and ``resume()`` fires it.
    """
    session = _reload(workflow)
    scheduling.lock_workflow(session, workflow)
    label = f"{type(workflow).__name__} #{workflow.id}"
    parked = session.scalars(
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow.id, StepExecution.state == StepState.WAITING)
        .order_by(StepExecution.id)
    ).first()
    if parked is None:
        session.rollback()
        raise UsageError(
            f"expire_wait: {label} is {workflow.state} with no execution parked waiting for a "
            "signal; run it to the step that waits first (perform_next_step)"
        )
    definition = workflow.steps.named(parked.step_name)
    if definition is None or definition.timeout is None:
        session.rollback()
        raise UsageError(
            f"expire_wait: step '{parked.step_name}' of {label} has no timeout=, so its wait "
            "never runs out; give the step timeout= and on_timeout="
        )
    transitions.arm_timeout(parked, utcnow())
    if workflow.state == WorkflowState.READY:
        timeouts.fire(session, workflow, parked)
    else:
        session.flush()
    _reload(workflow)
    return parked  # type: ignore[no-any-return]


def assert_signal_state(workflow: Any, signal_name: str, state: str) -> None:
    session = _reload(workflow)
    signal = session.scalars(
        select(Signal)
        .where(Signal.workflow_id == workflow.id, Signal.name == str(signal_name))
        .order_by(Signal.created_at.desc(), Signal.id.desc())
    ).first()
    if signal is None:
        raise AssertionError(
            f"Expected a {str(signal_name)!r} signal on {type(workflow).__name__}, but none was found"
        )
    if signal.state != str(state):
        raise AssertionError(
            f"Expected signal {str(signal_name)!r} to be {state}, but was {signal.state}"
        )


def expire_worker(worker_id: int) -> None:
    """Age worker ``worker_id`` past its lease (``settings.worker_lease``), as if its process had
    died: the next :func:`geneva_drive.liveness.recover_expired` recovers its steps. Committed in
    a transaction of its own. A worker whose heartbeat thread still runs renews its lease at its
    next beat."""
    aged = utcnow() - settings.worker_lease - settings.worker_heartbeat_interval
    with db.transaction() as session:
        found = session.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(heartbeat_at=aged)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
    if not found:
        raise LookupError(f"no worker #{worker_id} in geneva_drive_workers")


def fire_schedules(now: Any = None) -> Any:
    """Fire every schedule due at ``now`` (default: the clock), as a dispatcher sweep does;
    returns the :class:`geneva_drive.schedules.FireReport`. Commits in transactions of its own
    (commit the test's session first)."""
    from geneva_drive import schedules

    return schedules.fire_due(now)
