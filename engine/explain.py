"""The why-is-it-waiting line: one sentence saying why a workflow is where it is.

Computed by the engine so the dashboard, the CLI and logs say the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from geneva_drive import scheduling
from geneva_drive.config import settings
from geneva_drive.models import OperatorAction, StepExecution, utcnow
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    RUNNABLE_WORKFLOW_STATES,
    Operation,
    StepState,
    WorkflowState,
)

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow


#: What the executor records on an execution whose step its class does not define.
STEP_NOT_DEFINED = "geneva_drive.errors.StepNotDefinedError"


def humanize(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400 * 2:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


@dataclass
class _Facts:
    """What the lines of some workflows need, loaded with one query per kind of fact."""

    current: dict[int, StepExecution] = field(default_factory=dict)
    last: dict[int, StepExecution] = field(default_factory=dict)
    pause_actor: dict[int, str] = field(default_factory=dict)


def _latest_per_workflow(session: Session, entity: Any, ids: list[int], *where: Any) -> list[Any]:
    """The newest row of ``entity`` per workflow id (``created_at``, then ``id``, descending)."""
    rank = (
        func.row_number()
        .over(
            partition_by=entity.workflow_id,
            order_by=(entity.created_at.desc(), entity.id.desc()),
        )
        .label("rank")
    )
    ranked = select(entity.id, rank).where(entity.workflow_id.in_(ids), *where).subquery()
    newest = select(ranked.c.id).where(ranked.c.rank == 1)
    return list(session.scalars(select(entity).where(entity.id.in_(newest))))


def _load_facts(session: Session, workflows: list[Workflow]) -> _Facts:
    facts = _Facts()
    paused = [w.id for w in workflows if w.state == WorkflowState.PAUSED]
    moving = [w.id for w in workflows if w.state in RUNNABLE_WORKFLOW_STATES]
    if moving:
        rows = session.scalars(
            select(StepExecution)
            .where(
                StepExecution.workflow_id.in_(moving),
                StepExecution.state.in_(list(CURRENT_STEP_STATES)),
            )
            .order_by(StepExecution.id)
        )
        for execution in rows:
            facts.current.setdefault(execution.workflow_id, execution)
    if paused:
        for execution in _latest_per_workflow(session, StepExecution, paused):
            facts.last[execution.workflow_id] = execution
        actions = _latest_per_workflow(
            session, OperatorAction, paused, OperatorAction.action == Operation.PAUSE
        )
        for action in actions:
            if action.workflow_id is not None:
                facts.pause_actor[action.workflow_id] = action.actor
    return facts


def why_waiting(workflow: Workflow, now: datetime | None = None) -> str:
    """The line for one workflow (it must be attached to a session)."""
    session = scheduling.session_of(workflow)
    return _line(workflow, _load_facts(session, [workflow]), now or utcnow())


def why_waiting_many(
    session: Session, workflows: Iterable[Workflow], now: datetime | None = None
) -> dict[int, str]:
    """``{workflow_id: line}`` for a page of workflows, with a fixed number of queries.

    The dashboard's lists use this: one line per row would otherwise cost two or three
    queries per row.
    """
    workflows = list(workflows)
    facts = _load_facts(session, workflows)
    now = now or utcnow()
    return {w.id: _line(w, facts, now) for w in workflows}


def _line(workflow: Workflow, facts: _Facts, now: datetime) -> str:
    state = workflow.state
    if state == WorkflowState.FINISHED:
        return "finished"
    if state == WorkflowState.CANCELED:
        return "canceled"
    if state == WorkflowState.PAUSED:
        return _paused_line(workflow, facts, now)
    current = facts.current.get(workflow.id)
    if current is None:
        return "no step scheduled"
    step = current.step_name
    if current.state == StepState.WAITING:
        definition = workflow.steps.named(step)
        matcher = definition.signal_matcher if definition is not None else None
        since = current.waiting_since or current.created_at
        overdue = ""
        threshold = settings.waiting_visibility_threshold
        if threshold is not None and since < now - threshold:
            overdue = " (overdue)"
        return f"waiting for signal `{matcher}` since {humanize(now - since)}{overdue}"
    if current.state == StepState.IN_PROGRESS:
        started = current.started_at or now
        return f"running `{step}` for {humanize(now - started)}"
    if current.scheduled_for - now >= timedelta(seconds=1):
        return f"`{step}` scheduled in {humanize(current.scheduled_for - now)}"
    late = now - current.scheduled_for
    # Within the grace a worker may just not have picked it up yet: due, not overdue.
    if late < settings.overdue_after:
        return f"`{step}` due now"
    return f"`{step}` overdue by {humanize(late)}"


def _paused_line(workflow: Workflow, facts: _Facts, now: datetime) -> str:
    if workflow.steps.named(workflow.next_step_name) is None and workflow.next_step_name:
        return f"stranded: step `{workflow.next_step_name}` is no longer defined"
    last = facts.last.get(workflow.id)
    if (
        last is not None
        and last.state == StepState.FAILED
        and last.error_class_name == STEP_NOT_DEFINED
    ):
        # Paused because its step is gone (a deploy removed it): not an error to triage.
        return f"stranded: step `{last.step_name}` is no longer defined"
    if last is not None and last.state == StepState.FAILED and last.error_class_name:
        short = last.error_class_name.rsplit(".", 1)[-1]
        return f"paused after `{short}` in `{last.step_name}`"
    when = workflow.transitioned_at
    ago = f" {humanize(now - when)} ago" if when else ""
    actor = facts.pause_actor.get(workflow.id)
    if actor is not None:
        return f"paused by {actor}{ago}"
    return f"paused{ago}"
