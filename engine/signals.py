"""Workflow signals: deliver, deduplicate, wake, claim and consume.

A signal is an external event for one workflow (a webhook, a countersignature). A step with
``wait_for=`` parks at the gate until a matching signal is attached. Lifecycle:
``pending`` (buffered) → ``claimed`` (attached to an execution) → ``consumed`` (every step that
attached it resolved cleanly). ``claimed`` and ``consumed`` are also counters.

(Not to be confused with blinker signals, which live in :mod:`geneva_drive.instrumentation`.)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, InvalidRequestError
from sqlalchemy.orm import Session

from geneva_drive import children, scheduling, tracing, transitions
from geneva_drive.errors import InvalidInputError, ReservedSignalNameError, WorkflowNotOngoing
from geneva_drive.instrumentation import signal_delivered
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.serialization import check_text, serialize_payload
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    RESOLVING_OUTCOMES,
    SignalState,
    StepState,
    WorkflowState,
    is_ongoing,
)

if TYPE_CHECKING:
    from geneva_drive.steps import StepDefinition
    from geneva_drive.workflow import Workflow

log = logging.getLogger("geneva_drive.signals")


def claim(signal: Signal) -> None:
    signal.claimed = (signal.claimed or 0) + 1
    if signal.state == SignalState.PENDING:
        signal.state = SignalState.CLAIMED
        signal.claimed_at = utcnow()


def fully_resolved(
    session: Session, signal: Signal, resolved_step_names: list[str] | None = None
) -> bool:
    session.flush()
    attached = list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.signal_id == signal.id)
            .order_by(StepExecution.created_at, StepExecution.id)
        )
    )
    settled = set(resolved_step_names or ())
    remaining = [e for e in attached if e.step_name not in settled]
    if any(e.state in CURRENT_STEP_STATES for e in remaining):
        return False
    latest: OrderedDict[str, StepExecution] = OrderedDict()
    for execution in remaining:
        latest[execution.step_name] = execution
    return all(e.outcome in RESOLVING_OUTCOMES for e in latest.values())


def record_consumption(
    session: Session, signal: Signal, resolved_step_names: list[str] | None = None
) -> None:
    signal.consumed = (signal.consumed or 0) + 1
    if signal.state == SignalState.CLAIMED and fully_resolved(session, signal, resolved_step_names):
        signal.state = SignalState.CONSUMED
        signal.consumed_at = utcnow()


def resolve_attached(session: Session, execution: StepExecution) -> None:
    """A clean finish of an execution that carries a signal pin consumes it once."""
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id)
    if signal is not None:
        record_consumption(session, signal)


def settle_for_skipped(session: Session, execution: StepExecution) -> None:
    """A skipped execution settles its claimed signal by decree (its chain counts as resolved)."""
    if execution.signal_id is None:
        return
    signal = session.get(Signal, execution.signal_id)
    if signal is not None and signal.state == SignalState.CLAIMED:
        record_consumption(session, signal, [execution.step_name])


def attachable(session: Session, workflow: Workflow) -> list[Signal]:
    """Every non-consumed signal of the workflow, oldest first, adopted onto the live instance."""
    found = list(
        session.scalars(
            select(Signal)
            .where(Signal.workflow_id == workflow.id, Signal.state != SignalState.CONSUMED)
            .order_by(Signal.created_at, Signal.id)
        )
    )
    for signal in found:
        _adopt(signal, workflow)
    return found


def _adopt(signal: Signal, workflow: Workflow) -> None:
    # Matchers see the live workflow instance, never a reloaded copy.
    signal.__dict__["workflow"] = workflow


def attach_at_gate(
    session: Session, workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> Signal | None:
    """The gate: attach the oldest matching unconsumed signal, or return None to park."""
    matcher = step_def.signal_matcher
    for candidate in attachable(session, workflow):
        if matcher.matches(candidate):
            claim(candidate)
            execution.signal_id = candidate.id
            return candidate
    return None


def wake_matching(session: Session, workflow: Workflow, signal: Signal) -> list[StepExecution]:
    """Wake parked executions that ``signal`` matches. The workflow lock must be held."""
    if workflow.state == WorkflowState.PAUSED or not is_ongoing(workflow.state):
        return []
    _adopt(signal, workflow)
    woken: list[StepExecution] = []
    waiting = session.scalars(
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow.id, StepExecution.state == StepState.WAITING)
        .order_by(StepExecution.created_at, StepExecution.id)
    )
    for execution in list(waiting):
        step_def = workflow.steps.named(execution.step_name)
        if step_def is None or not step_def.waits_for_signal:
            continue
        if not step_def.signal_matcher.matches(signal):
            continue
        claim(signal)
        execution.signal_id = signal.id
        transitions.wake_execution(execution)
        woken.append(execution)
    if woken:
        session.flush()
        for execution in woken:
            scheduling.enqueue_execution(
                session, workflow, execution, workflow.steps.named(execution.step_name), force=True
            )
    return woken


def deliver(
    workflow: Workflow,
    name: Any,
    payload: Any = None,
    idempotency_key: Any = None,
    **unknown: Any,
) -> Signal:
    """``workflow.signal(...)``: one atomic delivery."""
    if unknown:
        raise InvalidInputError(f"Unknown options passed to signal(): {', '.join(sorted(unknown))}")
    if name is None or str(name).strip() == "":
        raise InvalidInputError("signal() requires a signal name")
    name = _bounded_text(str(name), "signal name")
    if name.startswith(RESERVED_PREFIX):
        raise ReservedSignalNameError(
            f"Signal names starting with {RESERVED_PREFIX!r} are the engine's own (a child's end "
            f"reaching its parent); {name!r} cannot be sent to workflow {workflow.id}. Use a "
            "name of your own."
        )
    key = (
        _bounded_text(str(idempotency_key), "idempotency_key")
        if idempotency_key is not None
        else None
    )
    data = serialize_payload({} if payload is None else payload)
    session = scheduling.session_of(workflow)

    # Lock first (on SQLite this opens the write transaction), then do everything in a
    # savepoint: an error anywhere inside leaves no signal row, no claim and no woken
    # execution behind, and drops the messages queued inside (geneva_drive.transport).
    _lock_or_refuse(session, workflow, name)
    with session.begin_nested():
        signal, duplicate = _insert_or_find(session, workflow, name, key, data)
        if not duplicate:
            # Sent from inside a span: the execution it wakes links to the sender
            # (docs/MANUAL.md, "Tracing"). Nothing with tracing off.
            tracing.remember_signal(workflow, signal.id)
        if not duplicate and workflow.state != WorkflowState.PAUSED:
            wake_matching(session, workflow, signal)
    if duplicate:
        signal.duplicate_delivery = True
    if signal_delivered.receivers:
        signal_delivered.send(
            "engine",
            workflow_id=workflow.id,
            workflow_class=type(workflow).__name__,
            name=name,
            duplicate=duplicate,
        )
    return signal


#: Signal names under this prefix are the engine's (``geneva_drive.child_ended``); never sent
#: through :func:`deliver`.
RESERVED_PREFIX = "geneva_drive."
#: The width of the ``name`` and ``idempotency_key`` columns.
MAX_NAME_LENGTH = 255


def _bounded_text(text: str, what: str) -> str:
    """Refuse a name or key the columns cannot hold alike on every backend (SQLite would store
    it, PostgreSQL would fail at the INSERT)."""
    if len(text) > MAX_NAME_LENGTH:
        raise InvalidInputError(
            f"The {what} is {len(text)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    return check_text(text, f"The {what}")


def _lock_or_refuse(session: Session, workflow: Workflow, name: str) -> None:
    cls, workflow_id = type(workflow), workflow.id
    try:
        scheduling.lock_workflow(session, workflow)
    except InvalidRequestError as error:
        # 2026-11-29, housekeeping deletes an old finished workflow in its own short
        # transaction, so it can vanish between the caller loading it and this lock (a webhook
        # retrying a signal to a long-finished workflow). That is a refusal, not a crash.
        if session.scalar(select(cls.id).where(cls.id == workflow_id)) is not None:
            raise
        raise WorkflowNotOngoing(
            f'Cannot deliver signal "{name}" to a workflow housekeeping deleted '
            f"({cls.__name__} #{workflow_id})"
        ) from error


def _insert_or_find(
    session: Session, workflow: Workflow, name: str, key: str | None, data: Any
) -> tuple[Signal, bool]:
    if not is_ongoing(workflow.state):
        existing = _find(session, workflow, name, key) if key is not None else None
        if existing is not None:
            return existing, True
        raise WorkflowNotOngoing(
            f'Cannot deliver signal "{name}" to a {workflow.state} workflow '
            f"({type(workflow).__name__} #{workflow.id})"
        )
    signal = Signal(
        workflow_id=workflow.id,
        name=name,
        idempotency_key=key,
        state=SignalState.PENDING,
        payload_json=data,
        claimed=0,
        consumed=0,
    )
    if key is not None:
        existing = _find(session, workflow, name, key)
        if existing is not None:
            return existing, True
        try:
            with session.begin_nested():
                session.add(signal)
                session.flush()
        except IntegrityError:
            # A concurrent delivery of the same key won the race; first payload wins.
            existing = _find(session, workflow, name, key)
            if existing is None:
                raise
            return existing, True
    else:
        session.add(signal)
        session.flush()
    return signal, False


def _find(session: Session, workflow: Workflow, name: str, key: str | None) -> Signal | None:
    return session.scalars(
        select(Signal).where(
            Signal.workflow_id == workflow.id, Signal.name == name, Signal.idempotency_key == key
        )
    ).first()


def rendezvous_waiting(session: Session, workflow: Workflow, execution: StepExecution) -> None:
    """On resume: release a parked execution whose step was removed, or wake it if a buffered
    signal matches now. The workflow lock must be held.

    A parked execution of a step that no longer waits for a signal (a deploy dropped its
    ``wait_for=``) is sent to run; the gem leaves it parked for good.
    """
    step_def = workflow.steps.named(execution.step_name)
    if step_def is not None and step_def.removed:
        transitions.skip_execution(execution)
        settle_for_skipped(session, execution)
        scheduling.schedule_next_step(session, workflow)
        return
    if step_def is None:
        return
    if step_def.wait_for_children:
        children.rendezvous(session, workflow, execution)
        return
    if not step_def.waits_for_signal:
        transitions.wake_execution(execution)
        session.flush()
        scheduling.enqueue_execution(session, workflow, execution, step_def, force=True)
        return
    for candidate in attachable(session, workflow):
        if step_def.signal_matcher.matches(candidate):
            wake_matching(session, workflow, candidate)
            return
