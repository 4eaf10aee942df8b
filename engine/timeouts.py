"""Time-bounded waits: what happens when a parked step's ``timeout=`` runs out (docs/MANUAL.md, "Time-bounded waits").

A step with ``wait_for=`` and ``timeout=`` parks like any other; parking also writes the
deadline, ``timeout_at`` (engine/transitions.py, ``park_execution``). The dispatcher's sweep
(engine/dispatch.py) finds parked executions past their deadline on the partial index of
``timeout_at`` and calls :func:`fire_due` for each workflow, holding its row lock; an operator's
``resume()`` calls :func:`fire_on_resume`. Firing applies the step's ``on_timeout``:

* ``"run"`` wakes the execution without a signal; its body runs with ``received_signal``
  None and ``wait_timed_out`` True, and completes with outcome ``timed_out``;
* ``"skip"`` closes it skipped and schedules the next step;
* ``"cancel"`` closes it and the workflow canceled;
* ``"pause"`` closes it canceled and pauses the workflow; ``resume()`` then runs the step again,
  which parks with a fresh deadline.

Each records ``timed_out_at`` and outcome ``timed_out`` on the execution.

Exactly once, and a signal racing it: every writer of a parked execution holds the workflow
lock (a signal's delivery, an operator, the executor, this module), and each rechecks under it
that the execution is still ``waiting``. Whichever commits first wins; the other finds the
execution woken (the time-out does nothing) or closed (the signal stays buffered, pending, as
any signal with no waiter does). Several dispatchers racing on one deadline are the same case.
A paused workflow's deadline does not fire (its state is not ``ready``); ``resume()`` fires a
deadline that passed meanwhile, unless a matching signal arrived before it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import persistence, scheduling, transitions
from geneva_drive.instrumentation import ContextAdapter, wait_timed_out
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.states import (
    Outcome,
    SignalState,
    StepState,
    TimeoutAction,
    WorkflowState,
)

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow

log = logging.getLogger("geneva_drive.timeouts")

#: Outcomes of an ``on_timeout="run"`` execution that did not finish its body: the step runs
#: again (a reattempt, the next slice of a resumable step, a retry after a failure) still
#: past its wait, so it passes the gate without a signal as the first run did.
_UNFINISHED_RUN_OUTCOMES = (Outcome.REATTEMPTED, Outcome.CONTINUED, Outcome.FAILED)


def fire_due(session: Session, workflow: Workflow, now: datetime) -> bool:
    """Fire the time-out of ``workflow``'s parked execution if its deadline is ``<= now``.

    The caller holds the workflow lock and owns the transaction. False when there is nothing to
    fire: the workflow is not ready (paused ones wait for ``resume()``), a signal woke the
    execution first, another dispatcher fired it, or the deadline is still ahead.
    """
    if workflow.state != WorkflowState.READY:
        return False
    execution = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.state == StepState.WAITING,
            StepExecution.timeout_at <= now,
        )
        .order_by(StepExecution.id)
        .limit(1)
        .execution_options(populate_existing=True)
    ).first()
    if execution is None:
        return False
    return fire(session, workflow, execution)


def fire_on_resume(session: Session, workflow: Workflow, execution: StepExecution) -> bool:
    """``resume()`` of a workflow parked past its deadline fires the time-out at once.

    Unless a matching signal was delivered (buffered, while the workflow was paused) no later
    than the deadline: it came first, so it wins and the caller wakes the step with it.
    """
    deadline = execution.timeout_at
    if deadline is None or deadline > utcnow():
        return False
    step_def = workflow.steps.named(execution.step_name)
    if step_def is not None and step_def.waits_for_signal:
        early = session.scalars(
            select(Signal)
            .where(
                Signal.workflow_id == workflow.id,
                Signal.state != SignalState.CONSUMED,
                Signal.created_at <= deadline,
            )
            .order_by(Signal.created_at, Signal.id)
        )
        if any(step_def.signal_matcher.matches(signal) for signal in early):
            return False
    return fire(session, workflow, execution)


def fire(session: Session, workflow: Workflow, execution: StepExecution) -> bool:
    """Apply the step's ``on_timeout`` to its parked ``execution`` (workflow lock held).

    A deploy may have changed the step since it parked: a step that no longer has a time-out
    (or is no longer defined) has its deadline cleared instead, so the sweep stops finding it;
    the action is always the one the running code defines.
    """
    context = ContextAdapter(
        log,
        {
            "workflow": type(workflow).__name__,
            "workflow_id": workflow.id,
            "execution_id": execution.id,
            "step": execution.step_name,
        },
    )
    step_def = workflow.steps.named(execution.step_name)
    if step_def is None or step_def.removed or step_def.on_timeout is None:
        transitions.arm_timeout(execution, None)
        persistence.flush(session)
        context.info("the step no longer has a time-out; the execution waits on")
        return False
    action = step_def.on_timeout
    transitions.time_out_execution(execution, action)
    if action == TimeoutAction.RUN:
        persistence.flush(session)
        scheduling.enqueue_execution(session, workflow, execution, step_def, force=True)
    elif action == TimeoutAction.SKIP:
        scheduling.schedule_next_step(session, workflow)
    elif action == TimeoutAction.CANCEL:
        transitions.workflow_canceled(workflow)
    else:
        transitions.workflow_paused(workflow)
    persistence.flush(session)
    context.info("wait for a signal timed out; on_timeout=%s", action.value)
    if wait_timed_out.receivers:
        wait_timed_out.send(
            "engine",
            execution_id=execution.id,
            workflow_id=workflow.id,
            workflow_class=type(workflow).__name__,
            workflow_type=workflow.type,
            step_name=execution.step_name,
            action=action.value,
        )
    return True


def continues_timed_out_run(session: Session, execution: StepExecution) -> bool:
    """At the gate, with no signal to attach: is ``execution`` another run of an
    ``on_timeout="run"`` step whose body did not finish (reattempted, continued, failed and
    resumed)? Then it carries the time-out over and runs without a signal, as the first did.

    Only asked for steps with ``timeout=`` that would park: steps without one pay nothing.
    """
    previous = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == execution.workflow_id,
            StepExecution.step_name == execution.step_name,
            StepExecution.id < execution.id,
        )
        .order_by(StepExecution.id.desc())
        .limit(1)
    ).first()
    if (
        previous is None
        or previous.timed_out_at is None
        or previous.outcome not in _UNFINISHED_RUN_OUTCOMES
    ):
        return False
    transitions.carry_time_out(execution, previous.timed_out_at)
    return True


__all__ = ["continues_timed_out_run", "fire", "fire_due", "fire_on_resume"]
