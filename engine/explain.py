"""The why-is-it-waiting line: one sentence saying why a workflow is where it is.

Computed by the engine so the dashboard, the CLI and logs say the same thing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select

from engine.config import settings
from engine.models import OperatorAction, StepExecution, utcnow
from engine.states import StepState, WorkflowState

if TYPE_CHECKING:
    from engine.workflow import Workflow


def humanize(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400 * 2:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def why_waiting(workflow: Workflow, now: datetime | None = None) -> str:
    from engine import scheduling

    now = now or utcnow()
    session = scheduling.session_of(workflow)
    state = workflow.state
    if state == WorkflowState.FINISHED:
        return "finished"
    if state == WorkflowState.CANCELED:
        return "canceled"
    if state == WorkflowState.PAUSED:
        if workflow.steps.named(workflow.next_step_name) is None and workflow.next_step_name:
            return f"stranded: step `{workflow.next_step_name}` is no longer defined"
        last = session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
            .limit(1)
        ).first()
        if last is not None and last.state == StepState.FAILED and last.error_class_name:
            short = last.error_class_name.rsplit(".", 1)[-1]
            return f"paused after `{short}` in `{last.step_name}`"
        action = session.scalars(
            select(OperatorAction)
            .where(OperatorAction.workflow_id == workflow.id, OperatorAction.action == "pause")
            .order_by(OperatorAction.id.desc())
            .limit(1)
        ).first()
        when = workflow.transitioned_at
        ago = f" {humanize(now - when)} ago" if when else ""
        if action is not None:
            return f"paused by {action.actor}{ago}"
        return f"paused{ago}"
    current = scheduling.current_execution(session, workflow)
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
    if current.scheduled_for > now:
        return f"`{step}` scheduled in {humanize(current.scheduled_for - now)}"
    late = now - current.scheduled_for
    if late < timedelta(seconds=5):
        return f"`{step}` due now"
    return f"`{step}` overdue by {humanize(late)}"
