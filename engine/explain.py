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

from geneva_drive import children, lateness, limits, scheduling
from geneva_drive.config import settings
from geneva_drive.models import OperatorAction, StepExecution, Worker, utcnow
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    RUNNABLE_WORKFLOW_STATES,
    Operation,
    Outcome,
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


def brief(delta: timedelta) -> str:
    """A short duration to the millisecond: "128 ms", "2.5 s", then as :func:`humanize`."""
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    return humanize(delta)


def humanize_remaining(delta: timedelta) -> str:
    """A time left, to the two largest units: "2 d 22 h", "5 h 12 min", "1 min 30 s", "45 s"."""
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    for big, big_unit, small, small_unit in (
        (days, "d", hours, "h"),
        (hours, "h", minutes, "min"),
        (minutes, "min", seconds, "s"),
    ):
        if big:
            return f"{big} {big_unit} {small} {small_unit}" if small else f"{big} {big_unit}"
    return f"{seconds} s"


def _timeout_clause(workflow: Workflow, execution: StepExecution, now: datetime) -> str:
    """The clause " — times out in 2 d 22 h (then cancel)" for a parked execution whose
    step (in the running code) still has a time-out; "" otherwise (docs/MANUAL.md, "Time-bounded waits")."""
    definition = workflow.steps.named(execution.step_name)
    if execution.timeout_at is None or definition is None or definition.on_timeout is None:
        return ""
    action = definition.on_timeout.value
    left = execution.timeout_at - now
    if left.total_seconds() < 1:
        return f" — times out now (then {action})"
    return f" — times out in {humanize_remaining(left)} (then {action})"


@dataclass
class _Facts:
    """What the lines of some workflows need, loaded with one query per kind of fact."""

    current: dict[int, StepExecution] = field(default_factory=dict)
    last: dict[int, StepExecution] = field(default_factory=dict)
    pause_actor: dict[int, str] = field(default_factory=dict)
    #: The name of the worker running each current in-progress execution, by worker id.
    worker_name: dict[int, str] = field(default_factory=dict)
    #: The usual duration of each running (class, step) (lateness.usual_durations).
    usual: dict[lateness.StepKey, timedelta] = field(default_factory=dict)
    #: The children by state of each parent parked on its join (``children.summaries``).
    children: dict[int, dict[str, int]] = field(default_factory=dict)


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
        running = {
            e.worker_id
            for e in facts.current.values()
            if e.state == StepState.IN_PROGRESS and e.worker_id is not None
        }
        if running:
            found = session.execute(select(Worker.id, Worker.name).where(Worker.id.in_(running)))
            facts.worker_name = {worker_id: name for worker_id, name in found}
        types = {w.id: w.type for w in workflows}
        in_progress = {
            (types[e.workflow_id], e.step_name)
            for e in facts.current.values()
            if e.state == StepState.IN_PROGRESS
        }
        if in_progress:
            facts.usual = lateness.usual_durations(session, in_progress, utcnow())
        joining = [
            w.id
            for w in workflows
            if (current := facts.current.get(w.id)) is not None
            and current.state == StepState.WAITING
            and children.is_join(w, current.step_name)
        ]
        facts.children = children.summaries(session, joining)
    canceled = [w.id for w in workflows if w.state == WorkflowState.CANCELED]
    if canceled:
        # A canceled workflow says why when its wait timed out (on_timeout="cancel").
        for execution in _latest_per_workflow(session, StepExecution, canceled):
            facts.last[execution.workflow_id] = execution
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
        return _canceled_line(workflow, facts)
    if state == WorkflowState.PAUSED:
        return _paused_line(workflow, facts, now)
    current = facts.current.get(workflow.id)
    if current is None:
        return "no step scheduled"
    step = current.step_name
    if current.state == StepState.WAITING:
        definition = workflow.steps.named(step)
        since = current.waiting_since or current.created_at
        if definition is None or definition.removed or not definition.parks:
            # The code no longer waits here (a deploy renamed or deleted the step, or dropped
            # its wait_for): never "signal `None`". Housekeeping's next pass releases it.
            gone = "is no longer defined" if definition is None else "no longer waits for a signal"
            return (
                f"stranded: parked on `{step}`, which {gone}, for {humanize(now - since)}; "
                "housekeeping releases it"
            )
        if definition.wait_for_children:
            # The parent's own counter, not a count of its children; the children that need an
            # operator (paused, after an error or by hand) are said first.
            timeout = _timeout_clause(workflow, current, now)
            waiting = f"{_children(workflow.children_open)} to end"
            phrases = [p for _, p in children_breakdown(facts.children.get(workflow.id, {}))]
            if phrases and not phrases[0].endswith("running"):
                open_total = sum(
                    n
                    for key, n in facts.children.get(workflow.id, {}).items()
                    if key in _OPEN_CHILD_KEYS
                )
                if open_total == workflow.children_open and len(phrases) == 1:
                    waiting = "them"
                return (
                    f"{', '.join(phrases)}: waiting for {waiting} since "
                    f"{humanize(now - since)}{timeout}"
                )
            return f"waiting for {waiting} since {humanize(now - since)}{timeout}"
        matcher = definition.signal_matcher
        overdue = ""
        threshold = settings.waiting_visibility_threshold
        if threshold is not None and since < now - threshold:
            overdue = " (overdue)"
        timeout = _timeout_clause(workflow, current, now)
        return f"waiting for signal `{matcher}` since {humanize(now - since)}{overdue}{timeout}"
    if current.state == StepState.IN_PROGRESS:
        started = current.started_at or now
        line = f"running `{step}`{_on_worker(current, facts)} for {humanize(now - started)}"
        usual = facts.usual.get((workflow.type, step))
        if usual is not None and lateness.is_running_long(current, usual, now):
            # Far past its own history (engine/lateness.py), not past a flat threshold.
            line += f", far past its usual {brief(usual)} (p99)"
        return line
    if current.deferred_on is not None:
        # Held back by a concurrency or rate limit (docs/MANUAL.md, "Concurrency and rate limits"); late past the overdue grace.
        held_for = ""
        if lateness.is_held_late(current, now):
            held_for = f" since {humanize(now - lateness.held_since(current))} (late)"
        held = limits.why_deferred(
            scheduling.session_of(workflow), workflow, current, now, since=held_for
        )
        if held is not None:
            return held
    if current.scheduled_for - now >= timedelta(seconds=1):
        return f"`{step}` scheduled in {humanize(current.scheduled_for - now)}"
    late = now - current.scheduled_for
    # Within the grace a worker may just not have picked it up yet: due, not overdue.
    if late < settings.overdue_after:
        return f"`{step}` due now"
    return f"`{step}` overdue by {humanize(late)}"


def _on_worker(execution: StepExecution, facts: _Facts) -> str:
    """The clause " on celery@host/812" when a registered worker started the execution; ""
    otherwise (started before workers were recorded, or outside any worker). A worker whose
    row is gone is still named, by id."""
    if execution.worker_id is None:
        return ""
    name = facts.worker_name.get(execution.worker_id)
    if name is None:
        return f" on worker #{execution.worker_id}"
    # The name is the worker's own text (given at registration, or its hostname): a backtick in it
    # would read as the step markup the dashboard turns into <code>.
    return " on " + name.replace("`", "'")


def _children(count: int) -> str:
    return "1 child workflow" if count == 1 else f"{count} child workflows"


#: The open children's kinds in the order a parent's line says them: what needs an operator
#: first (``children.summaries`` keys).
_OPEN_CHILD_KEYS = (
    children.PAUSED_AFTER_ERROR,
    WorkflowState.PAUSED,
    WorkflowState.READY,
    WorkflowState.PERFORMING,
)


def children_breakdown(by_state: dict[str, int]) -> list[tuple[str, str]]:
    """A parent's open children as ``(key, phrase)``, those that need an operator first:
    ``[("paused_after_error", "37 children paused after errors"), ("paused", "1 paused"),
    ("ready", "3 running")]``. The first phrase names the children; ``key`` is a
    ``children.summaries`` key (``ready`` stands for ready and performing)."""
    failed = by_state.get(children.PAUSED_AFTER_ERROR, 0)
    paused = by_state.get(WorkflowState.PAUSED, 0)
    running = by_state.get(WorkflowState.READY, 0) + by_state.get(WorkflowState.PERFORMING, 0)
    parts: list[tuple[str, int, str]] = []
    if failed:
        errors = "an error" if failed == 1 else "errors"
        parts.append((children.PAUSED_AFTER_ERROR, failed, f"paused after {errors}"))
    if paused:
        parts.append((WorkflowState.PAUSED, paused, "paused"))
    if running:
        parts.append((WorkflowState.READY, running, "running"))
    phrases = []
    for i, (key, count, what) in enumerate(parts):
        noun = ("child " if count == 1 else "children ") if i == 0 else ""
        phrases.append((key, f"{count} {noun}{what}"))
    return phrases


def _canceled_line(workflow: Workflow, facts: _Facts) -> str:
    """ "canceled", or why, when its wait timed out: "timed out waiting for
    `payment_confirmed` after 3 d (then cancel)"."""
    last = facts.last.get(workflow.id)
    if last is None or last.outcome != Outcome.TIMED_OUT or last.timed_out_at is None:
        return "canceled"
    definition = workflow.steps.named(last.step_name)
    if definition is not None and definition.parks and not definition.wait_for_children:
        waited = f"`{definition.signal_matcher}`"
    elif definition is not None and definition.wait_for_children:
        waited = "child workflows"
    else:
        waited = f"a signal in `{last.step_name}`"
    # The wait it was given (the deadline), not when the sweep came round to fire it.
    since = last.waiting_since or last.created_at
    after = humanize_remaining((last.timeout_at or last.timed_out_at) - since)
    return f"timed out waiting for {waited} after {after} (then cancel)"


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
    if last is not None and last.outcome == Outcome.TIMED_OUT and last.timed_out_at is not None:
        # on_timeout="pause": the wait ran out; resume() parks the step again.
        definition = workflow.steps.named(last.step_name)
        waited = f"signal `{definition.signal_matcher}`" if definition is not None else "a signal"
        ago = humanize(now - last.timed_out_at)
        return f"paused: the wait for {waited} in `{last.step_name}` timed out {ago} ago"
    if last is not None and last.error_class_name == children.CHILD_CANCELED:
        # on_child_failure="pause" (docs/MANUAL.md, "Fan-out and join: child workflows"): resume() runs the join anyway.
        return f"paused: child workflows ended canceled before `{last.step_name}`"
    if last is not None and last.state == StepState.FAILED and last.error_class_name:
        short = last.error_class_name.rsplit(".", 1)[-1]
        return f"paused after `{short}` in `{last.step_name}`"
    when = workflow.transitioned_at
    ago = f" {humanize(now - when)} ago" if when else ""
    actor = facts.pause_actor.get(workflow.id)
    if actor is not None:
        return f"paused by {actor}{ago}"
    return f"paused{ago}"
