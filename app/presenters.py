"""Presenters: plain values the templates display, built from geneva_drive objects.

Templates make no decisions. Which buttons exist comes from ``geneva_drive.states`` predicates
(``allowed_operator_actions``) and the user's role; the why-is-it-waiting line comes from
``geneva_drive.explain``. Nothing here keeps its own copy of a state rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import children, lateness, limits, states
from geneva_drive.dashboard import queries
from geneva_drive.dashboard.formatting import duration
from geneva_drive.dashboard.queries import is_stranded_step
from geneva_drive.explain import children_breakdown, humanize_remaining, why_waiting_many
from geneva_drive.models import OperatorAction, Signal, StepExecution, utcnow
from geneva_drive.signal_matcher import matcher_name
from geneva_drive.states import (
    BULK_OPERATIONS,
    CURRENT_STEP_STATES,
    Operation,
    StepState,
    WorkflowState,
)
from geneva_drive.steps import StepDefinition
from geneva_drive.workflow import Workflow, workflow_class

if TYPE_CHECKING:
    # Only a type here: the CLI presents workflows in a process without Flask.
    from geneva_drive.dashboard.auth import DashboardUser

#: The visible label of each operator action (DASHBOARD.md, exact text).
ACTION_LABELS: dict[str, str] = {
    Operation.PAUSE: "Pause",
    Operation.RESUME: "Resume",
    Operation.SKIP: "Skip",
    Operation.CANCEL: "Cancel",
    Operation.REATTEMPT: "Reattempt",
    Operation.RESUME_AT: "Resume at",
    Operation.SIGNAL: "Send signal",
}
_BULK_LABELS: dict[str, tuple[str, str]] = {
    Operation.PAUSE: ("Pause selected", "paused"),
    Operation.RESUME: ("Resume selected", "resumed"),
    Operation.CANCEL: ("Cancel selected", "canceled"),
    Operation.RESUME_AT: ("Resume selected at", "resumed at"),
    Operation.REATTEMPT: ("Reattempt selected", "reattempted"),
}
#: The bulk actions (the engine's BULK_OPERATIONS, in its order) and their labels; ``verb``
#: completes "N workflows will be …". The bulk bar's buttons are rendered from this.
BULK_ACTIONS: dict[str, tuple[str, str]] = {op: _BULK_LABELS[op] for op in BULK_OPERATIONS}
#: Actions that throw work away: their confirm button is red and the dialog opens on Back.
DESTRUCTIVE_ACTIONS = frozenset({Operation.CANCEL, Operation.SKIP})
#: Bulk actions whose button is styled as dangerous.
DANGEROUS_BULK_ACTIONS = DESTRUCTIVE_ACTIONS & frozenset(BULK_OPERATIONS)
#: Actions that throw work away or jump in the plan ask for confirmation first.
CONFIRM_QUESTIONS: dict[str, str] = {
    Operation.SKIP: "Skip the current step of workflow #{id}? It will not run.",
    Operation.CANCEL: "Cancel workflow #{id}? A canceled workflow never runs again.",
    Operation.REATTEMPT: "Run the current step of workflow #{id} again now?",
    Operation.RESUME_AT: "Resume workflow #{id} at {{step}}? Steps in between will not run.",
}
#: The confirm button of each action: it repeats the action and names its object. ``{step}``
#: is filled in by the browser from the form's Step select (static/js/app.js).
CONFIRM_LABELS = {
    "skip": "Skip the step of workflow #{id}",
    "cancel": "Cancel workflow #{id}",
    "reattempt": "Reattempt workflow #{id}",
    "resume_at": "Resume workflow #{id} at {{step}}",
}


def bulk_confirm_label(action: str, count: int, step: str = "", *, background: bool) -> str:
    """The bulk preview's confirm button: "Resume 5 workflows at charge", "Cancel 1 workflow"."""
    verb = {
        "pause": "Pause",
        "resume": "Resume",
        "cancel": "Cancel",
        "resume_at": "Resume",
        "reattempt": "Reattempt",
    }[action]
    if background:
        what = "all matching workflows"
    else:
        what = f"{count:,} workflow{'' if count == 1 else 's'}"
    return f"{verb} {what} at {step}" if action == "resume_at" else f"{verb} {what}"


#: The signal inbox's bulk deliver: its button, and "N workflows will …" (the engine's
#: ``signal`` action with ``waiting_only``; not on the workflow list's bulk bar).
SIGNAL_BULK_LABEL = ("Send signal to selected", "sent")


def signal_confirm_label(name: str, count: int) -> str:
    """The inbox's bulk confirm button: "Send payment_confirmed to 5 workflows"."""
    return f"Send {name} to {count:,} workflow{'' if count == 1 else 's'}"


#: Above this many workflows a bulk confirm asks for the count to be typed (DASHBOARD.md).
TYPED_CONFIRM_OVER = 100


def typed_confirmation(count: int, *, background: bool) -> str | None:
    """What the operator must type to confirm a bulk action, or None (100 rows or fewer).

    The count itself ("204"); "all" for a background action over the whole filter, whose
    count is not known up front. Enter-Enter on a big action then does nothing.
    """
    if background:
        return "all"
    return str(count) if count > TYPED_CONFIRM_OVER else None


def typed_matches(typed: str, expected: str) -> bool:
    """The typed confirmation, forgiving thousands separators and spaces ("1,204" = "1204")."""
    cleaned = "".join(c for c in typed if c not in " ,._'").lower()
    return cleaned == expected


#: A start later than this after ``scheduled_for`` is shown as a late start.
LATE_START = timedelta(minutes=1)


@dataclass(frozen=True)
class Badge:
    """A state word shown as text (colour is only a second signal)."""

    label: str
    tone: str


def state_badge(state: str) -> Badge:
    tone = {
        "ready": "info",
        "performing": "active",
        "paused": "warn",
        "finished": "ok",
        "canceled": "muted",
        "scheduled": "info",
        "waiting": "wait",
        "in_progress": "active",
        "completed": "ok",
        "failed": "bad",
        "skipped": "muted",
        "pending": "wait",
        "claimed": "info",
        "consumed": "ok",
    }.get(state, "muted")
    return Badge(state.replace("_", " "), tone)


def whole_seconds(delta: timedelta) -> timedelta:
    """A lateness to show: "late by 38 s", not "late by 38.4 s"."""
    return timedelta(seconds=int(delta.total_seconds()))


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# --- rows of lists ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowRow:
    id: int
    workflow_class: str
    class_known: bool
    hero_type: str | None
    hero_id: str | None
    state: str
    badges: list[Badge]
    next_step: str | None
    why: str
    updated_at: datetime
    created_at: datetime
    #: Phrases of ``why`` that link to the workflows list (its query parameters): a parent's
    #: children counts by state.
    why_links: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    #: The error message of a workflow paused after an error (its newest execution failed).
    error_message: str | None = None
    parent_id: int | None = None


def _current_by_workflow(session: Session, ids: list[int]) -> dict[int, StepExecution]:
    if not ids:
        return {}
    rows = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id.in_(ids),
            StepExecution.state.in_(list(CURRENT_STEP_STATES)),
        )
        .order_by(StepExecution.id)
    )
    found: dict[int, StepExecution] = {}
    for execution in rows:
        found.setdefault(execution.workflow_id, execution)
    return found


def _badges(
    workflow: Workflow,
    current: StepExecution | None,
    now: datetime,
    usual: timedelta | None = None,
) -> list[Badge]:
    badges = [state_badge(workflow.state)]
    if workflow.state == states.WorkflowState.PAUSED and is_stranded_step(
        workflow.type, workflow.next_step_name
    ):
        badges.append(Badge("stranded", "bad"))
    if current is None or not states.is_runnable(workflow.state):
        return badges
    if current.state == StepState.WAITING:
        badges.append(Badge("waiting", "wait"))
        if lateness.is_waiting_too_long(current, now):
            badges.append(Badge("waiting too long", "bad"))
    elif lateness.is_held_late(current, now):
        # Waiting nobody chose: held back by a limit past the grace, the limit named.
        name = limits.split_slot(current.deferred_on or "")[0]
        held = duration(whole_seconds(now - lateness.held_since(current)))
        badges.append(Badge(f"late: held by {name} for {held}", "bad"))
    elif lateness.is_overdue(current, now):
        # Late beyond the grace only (settings.overdue_after), and always by how much.
        late = duration(whole_seconds(now - current.scheduled_for))
        badges.append(Badge(f"overdue, late by {late}", "bad"))
    elif current.state == StepState.IN_PROGRESS and lateness.is_stuck(current, now):
        badges.append(Badge("stuck", "bad"))
    elif lateness.is_running_long(current, usual, now):
        badges.append(Badge("running long", "bad"))
    return badges


def _usual_of(
    usual: dict[lateness.StepKey, timedelta], workflow: Workflow, current: StepExecution | None
) -> timedelta | None:
    return None if current is None else usual.get((workflow.type, current.step_name))


def _why(workflow: Workflow, why: str) -> str:
    """The why line, unless it only repeats the state badge beside it ("finished" twice)."""
    if why == workflow.state and not workflow.is_ongoing:
        return "nothing left to run"
    return why


def workflow_rows(session: Session, workflows: Iterable[Workflow]) -> list[WorkflowRow]:
    """List rows; the current executions of the whole page come from one query."""
    workflows = list(workflows)
    now = utcnow()
    currents = _current_by_workflow(session, [w.id for w in workflows])
    whys = why_waiting_many(session, workflows, now=now)
    types = {w.id: w.type for w in workflows}
    usual = lateness.usual_durations(
        session,
        {
            (types[c.workflow_id], c.step_name)
            for c in currents.values()
            if c.state == StepState.IN_PROGRESS
        },
        now,
    )
    errors = queries.paused_after_error_messages(
        session, [w.id for w in workflows if w.state == WorkflowState.PAUSED]
    )
    parents = children.summaries(
        session, [w.id for w in workflows if w.children_open and w.is_ongoing]
    )
    return [
        WorkflowRow(
            id=w.id,
            workflow_class=w.type,
            class_known=workflow_class(w.type) is not None,
            hero_type=w.hero_type,
            hero_id=w.hero_id,
            state=w.state,
            badges=_badges(w, currents.get(w.id), now, _usual_of(usual, w, currents.get(w.id))),
            next_step=w.next_step_name,
            why=_why(w, whys[w.id]),
            updated_at=w.updated_at,
            created_at=w.created_at,
            why_links=_children_links(w.id, whys[w.id], parents.get(w.id, {})),
            error_message=errors.get(w.id),
            parent_id=w.parent_id,
        )
        for w in workflows
    ]


def children_filter(parent_id: int, key: str) -> dict[str, str]:
    """The query parameters of a parent's children of one ``children.summaries`` key."""
    params = {"parent": str(parent_id)}
    if key == children.PAUSED_AFTER_ERROR:
        params.update(state=WorkflowState.PAUSED, due="failed")
    elif key != "all":
        params["state"] = key
    return params


def _children_links(
    parent_id: int, why: str, by_state: dict[str, int]
) -> list[tuple[str, dict[str, str]]]:
    """Each children count a parent's why-line says, with the filtered list it links to."""
    return [
        (phrase, children_filter(parent_id, key))
        for key, phrase in children_breakdown(by_state)
        if phrase in why
    ]


# --- the detail page ------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionControl:
    name: str
    label: str
    confirm: str | None
    confirm_label: str = ""
    danger: bool = False


@dataclass(frozen=True)
class StepPlanRow:
    name: str
    status: str
    removed: bool
    options: list[str]


@dataclass
class ExecutionView:
    id: int
    step_name: str
    attempt: int
    state: Badge
    outcome: str | None
    scheduled_for: datetime
    started_at: datetime | None
    ended_at: datetime | None
    duration: float | None
    overdue: bool
    #: How late a scheduled execution is, once it is overdue (else None).
    overdue_by: timedelta | None
    late_by: timedelta | None
    waiting_since: datetime | None
    waiting_too_long: bool
    #: The deadline of a parked execution with a time-out (docs/MANUAL.md, "Time-bounded waits"), else None.
    timeout_at: datetime | None
    #: When its wait timed out (outcome timed_out), else None.
    timed_out_at: datetime | None
    error_class: str | None
    error_message: str | None
    error_backtrace: str | None
    cursor: str | None
    #: How far the cursor moved during this execution (numeric cursors of a chain), else None.
    advanced: float | None
    signal_id: int | None
    metadata: str | None
    created_at: datetime
    #: A limit holding it back (docs/MANUAL.md, "Concurrency and rate limits"): "a slot of
    #: `tenant-sync` [megacorp.example]" while deferred, since when, and whether that is late.
    held_by: str | None = None
    held_since: datetime | None = None
    held_late: bool = False
    #: The (limit, key) pairs the execution counts against.
    slots: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class ChainView:
    """Executions of one resumable step linked by ``continues_from_id``, as one group."""

    step_name: str
    hops: list[ExecutionView]

    @property
    def created_at(self) -> datetime:
        return self.hops[0].created_at

    @property
    def last(self) -> ExecutionView:
        return self.hops[-1]


@dataclass(frozen=True)
class SignalView:
    id: int
    workflow_id: int
    name: str
    state: Badge
    claimed: int
    consumed: int
    idempotency_key: str | None
    payload: str
    created_at: datetime
    claimed_at: datetime | None
    consumed_at: datetime | None


@dataclass(frozen=True)
class ActionView:
    id: int
    actor: str
    action: str
    label: str
    params: str | None
    from_state: str | None
    to_state: str | None
    result: str
    message: str | None
    created_at: datetime
    workflow_id: int | None


@dataclass(frozen=True)
class TimelineEntry:
    kind: str  # "execution" | "chain" | "action" | "signal"
    at: datetime
    item: Any


@dataclass
class WorkflowDetail:
    row: WorkflowRow
    current_step: str | None
    transitioned_at: datetime | None
    actions: list[ActionControl]
    runnable_steps: list[str]
    plan: list[StepPlanRow]
    timeline: list[TimelineEntry]
    signals: list[SignalView]
    metadata: str | None
    job_options: str | None
    live: bool
    refusal: str | None = None
    notice: str | None = None
    #: The signal the current step waits for: the send-signal form's Name starts with it.
    awaited_signal: str | None = None
    #: The step a paused workflow is stranded on (its class no longer defines it), else None.
    stranded_on: str | None = None
    #: ``?before=`` of the timeline's next older page (None: the oldest is shown).
    timeline_older: int | None = None
    #: The ``?before=`` this timeline page was asked for (None: the newest page).
    timeline_before: int | None = None
    #: "7 of 10 finished, 1 paused, 2 running": its child workflows (None without any).
    children: str | None = None
    #: A parent's children by state, those needing an operator first: (label, count, params).
    children_by_state: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    #: The workflow whose step started this one (docs/MANUAL.md, "Fan-out and join: child workflows"), else None.
    parent_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def action_controls(
    state: str, user: DashboardUser | None, workflow_id: int
) -> list[ActionControl]:
    """The buttons for a workflow in ``state``: the engine's predicates, and operators only."""
    if user is None or not user.can_act:
        return []
    return [
        ActionControl(
            name=name,
            label=ACTION_LABELS[name],
            confirm=CONFIRM_QUESTIONS[name].format(id=workflow_id)
            if name in CONFIRM_QUESTIONS
            else None,
            confirm_label=CONFIRM_LABELS.get(name, ACTION_LABELS[name]).format(id=workflow_id),
            danger=name in DESTRUCTIVE_ACTIONS,
        )
        for name in states.allowed_operator_actions(state)
    ]


def execution_view(execution: StepExecution, attempt: int, now: datetime) -> ExecutionView:
    late_by = None
    if execution.started_at is not None and execution.started_at - execution.scheduled_for > (
        LATE_START
    ):
        late_by = execution.started_at - execution.scheduled_for
    waiting_too_long = lateness.is_waiting_too_long(execution, now)
    metadata = {k: v for k, v in (execution.metadata_ or {}).items() if k != "exception"}
    held_by = None
    slot = execution.deferred_on
    if slot is not None and execution.state == StepState.SCHEDULED:
        what = "a token" if slot == execution.rate_slot else "a slot"
        name, key = limits.split_slot(slot)
        held_by = f"{what} of `{name}`" + (f" [{key}]" if key else "")
    view = ExecutionView(
        id=execution.id,
        step_name=execution.step_name,
        attempt=attempt,
        state=state_badge(execution.state),
        outcome=execution.outcome,
        scheduled_for=execution.scheduled_for,
        started_at=execution.started_at,
        ended_at=execution.finished_at,
        duration=execution.duration_seconds,
        overdue=lateness.is_overdue(execution, now),
        overdue_by=(
            whole_seconds(now - execution.scheduled_for)
            if lateness.is_overdue(execution, now)
            else None
        ),
        late_by=late_by,
        waiting_since=execution.waiting_since,
        waiting_too_long=waiting_too_long,
        timeout_at=execution.timeout_at if execution.state == StepState.WAITING else None,
        timed_out_at=execution.timed_out_at,
        error_class=execution.error_class_name,
        error_message=execution.error_message,
        error_backtrace=execution.error_backtrace,
        cursor=_json(execution.cursor) if execution.cursor is not None else None,
        advanced=None,
        signal_id=execution.signal_id,
        metadata=_json(metadata) if metadata else None,
        created_at=execution.created_at,
    )
    if held_by is not None:
        view.held_by = held_by
        view.held_since = lateness.held_since(execution)
        view.held_late = lateness.is_held_late(execution, now)
    view.slots = [
        limits.split_slot(s)
        for s in dict.fromkeys(
            (execution.limit_slot, execution.step_limit_slot, execution.rate_slot)
        )
        if s is not None
    ]
    return view


def signal_view(signal: Signal) -> SignalView:
    return SignalView(
        id=signal.id,
        workflow_id=signal.workflow_id,
        name=signal.name,
        state=state_badge(signal.state),
        claimed=signal.claimed or 0,
        consumed=signal.consumed or 0,
        idempotency_key=signal.idempotency_key,
        payload=_json(signal.payload_json if signal.payload_json is not None else {}),
        created_at=signal.created_at,
        claimed_at=signal.claimed_at,
        consumed_at=signal.consumed_at,
    )


def action_view(action: OperatorAction) -> ActionView:
    name = action.action
    base = name.removeprefix("bulk_")
    label = ACTION_LABELS.get(base, base)
    if name == f"bulk_{Operation.SIGNAL}":
        label = SIGNAL_BULK_LABEL[0]
    elif name.startswith("bulk_"):
        label = BULK_ACTIONS.get(base, (label, ""))[0]
    return ActionView(
        id=action.id,
        actor=action.actor,
        action=name,
        label=label,
        params=_json(action.params) if action.params else None,
        from_state=action.from_state,
        to_state=action.to_state,
        result=action.result,
        message=action.message,
        created_at=action.created_at,
        workflow_id=action.workflow_id,
    )


def _stranded_step(workflow: Workflow, executions: list[StepExecution]) -> str | None:
    """The step a paused workflow is stranded on (its class no longer runs it), if any."""
    if workflow.state != states.WorkflowState.PAUSED:
        return None
    last = executions[-1] if executions else None
    if (
        last is not None
        and last.state == StepState.FAILED
        and last.error_class_name == queries.STEP_NOT_DEFINED
    ):
        return last.step_name
    if is_stranded_step(workflow.type, workflow.next_step_name):
        return workflow.next_step_name
    return None


def _plan(workflow: Workflow, executions: list[StepExecution]) -> list[StepPlanRow]:
    latest: dict[str, StepExecution] = {}
    for execution in executions:
        latest[execution.step_name] = execution
    newest = executions[-1] if executions else None
    current = next((e for e in reversed(executions) if e.state in CURRENT_STEP_STATES), None)
    current_name = current.step_name if current is not None else None
    if current_name is None and workflow.state == states.WorkflowState.PAUSED:
        current_name = workflow.next_step_name
    stranded_on = _stranded_step(workflow, executions)
    if stranded_on is not None:
        # The step it would run is gone: no defined step is "current".
        current_name = None
    rows = []
    for definition in workflow.steps:
        last_run = latest.get(definition.name)
        if definition.name == stranded_on:
            status = "stranded here"
        elif definition.removed:
            status = "removed"
        elif definition.name == current_name:
            status = "current"
        elif last_run is not None:
            status = {
                str(StepState.COMPLETED): "done",
                str(StepState.SKIPPED): "skipped",
                str(StepState.FAILED): "failed",
                str(StepState.CANCELED): "canceled",
            }.get(last_run.state, "upcoming")
            if status == "failed" and last_run is not newest:
                # It failed, and the workflow moved past it (an operator skipped it or resumed
                # at another step): it did not run, it was skipped.
                status = "skipped"
        else:
            status = "upcoming" if workflow.is_ongoing else "not run"
        rows.append(
            StepPlanRow(definition.name, status, definition.removed, step_options(definition))
        )
    if stranded_on is not None and workflow.steps.named(stranded_on) is None:
        rows.append(StepPlanRow(stranded_on, "stranded here (not defined)", True, []))
    elif current_name and workflow.steps.named(current_name) is None:
        rows.append(StepPlanRow(current_name, "not defined", True, []))
    return rows


def step_options(definition: StepDefinition) -> list[str]:
    """The options of a step in words, for the plan and the definitions page."""
    options = []
    if definition.resumable:
        options.append("resumable")
    if definition.wait is not None:
        options.append(f"wait {duration(definition.wait)}")
    if definition.wait_for is not None:
        options.append(f"wait_for {matcher_name(definition.wait_for) or definition.wait_for}")
    if definition.timeout is not None and definition.on_timeout is not None:
        options.append(f"timeout {duration(definition.timeout)} then {definition.on_timeout}")
    if definition.skip_if is not None:
        options.append(f"skip_if {getattr(definition.skip_if, '__name__', definition.skip_if)}")
    if definition.on_exception_action:
        options.append(f"on_exception {definition.on_exception_action}")
    elif definition.exception_policy is not None:
        options.append("exception policy")
    if definition.max_iterations:
        options.append(f"max_iterations {definition.max_iterations}")
    if definition.max_runtime:
        options.append(f"max_runtime {duration(definition.max_runtime)}")
    if definition.before_step:
        options.append(f"before {definition.before_step}")
    if definition.after_step:
        options.append(f"after {definition.after_step}")
    if definition.job_options:
        options.append("job_options " + json.dumps(definition.job_options, default=str))
    if definition.concurrency_limit is not None:
        limit = definition.concurrency_limit
        options.append(f"concurrency_limit {limit.name} {limit.limit} at once")
    if definition.rate_limit is not None:
        rate = definition.rate_limit
        options.append(f"rate_limit {rate.name} {rate.limit} per {duration(rate.window)}")
    return options


def _timeline(
    executions: list[StepExecution],
    signals: list[Signal],
    actions: list[OperatorAction],
    now: datetime,
) -> list[TimelineEntry]:
    attempts: dict[str, int] = {}
    views: dict[int, ExecutionView] = {}
    for execution in executions:
        attempts[execution.step_name] = attempts.get(execution.step_name, 0) + 1
        views[execution.id] = execution_view(execution, attempts[execution.step_name], now)
    chain_of: dict[int, ChainView] = {}
    entries: list[TimelineEntry] = []
    by_id = {e.id: e for e in executions}
    for execution in executions:
        view = views[execution.id]
        parent = execution.continues_from_id
        if parent is not None and parent in by_id:
            view.advanced = _advance(by_id[parent].cursor, execution)
        if parent is not None and parent in chain_of:
            chain_of[parent].hops.append(view)
            chain_of[execution.id] = chain_of[parent]
            continue
        if parent is not None and parent in views:
            # The predecessor was shown on its own so far; turn it into a chain.
            chain = ChainView(execution.step_name, [views[parent], view])
            entries = [e for e in entries if not (e.kind == "execution" and e.item.id == parent)]
            entries.append(TimelineEntry("chain", chain.created_at, chain))
            chain_of[parent] = chain
            chain_of[execution.id] = chain
            continue
        entries.append(TimelineEntry("execution", view.created_at, view))
    entries.extend(TimelineEntry("signal", s.created_at, signal_view(s)) for s in signals)
    entries.extend(TimelineEntry("action", a.created_at, action_view(a)) for a in actions)
    order = {"execution": 0, "chain": 0, "signal": 1, "action": 2}
    entries.sort(key=lambda e: (e.at, order[e.kind]))
    return entries


def _advance(start: Any, execution: StepExecution) -> float | None:
    """Cursor progress of one hop: its cursor minus the one it continued from (numbers only)."""
    end = execution.cursor
    numbers = (int, float)
    if execution.state != StepState.COMPLETED:
        return None
    if isinstance(start, numbers) and isinstance(end, numbers) and not isinstance(end, bool):
        return float(end - start)
    return None


def workflow_detail(
    session: Session, workflow: Workflow, user: DashboardUser | None, before: int | None = None
) -> WorkflowDetail:
    now = utcnow()
    # The timeline shows one page of executions (the newest, or those before ``before``) with
    # the signals and actions of its time range; the plan, the stranded step and the awaited
    # signal need only the newest execution of each step, whatever the page.
    page = queries.execution_page(session, workflow.id, before)
    executions = sorted(
        queries.latest_per_step(session, workflow.id), key=lambda e: (e.created_at, e.id)
    )
    signals = queries.signals_of(session, workflow.id)
    shown_signals = [
        s
        for s in signals
        if (page.since is None or s.created_at >= page.since)
        and (page.until is None or s.created_at < page.until)
    ]
    actions = queries.actions_of(session, workflow.id, page.since, page.until)
    row = workflow_rows(session, [workflow])[0]
    stranded_on = _stranded_step(workflow, executions)
    controls = action_controls(workflow.state, user, workflow.id)
    if stranded_on is not None:
        # Resume would run the missing step again (StepNotDefinedError) or jump, unannounced,
        # to whatever next_step_name still says, and Reattempt is a resume here: neither can
        # do what its confirmation says. Only Resume at (a step that exists) or the stranded
        # drain get it moving; the engine refuses the other two with that way out.
        controls = [c for c in controls if c.name not in (Operation.RESUME, Operation.REATTEMPT)]
        if not any(b.label == "stranded" for b in row.badges):
            row.badges.append(Badge("stranded", "bad"))
    metadata = {k: v for k, v in (workflow.metadata_ or {}).items() if k != "step_job_options"}
    job_options = {
        "class": type(workflow).class_step_job_options(),
        "workflow": workflow.step_job_options,
    }
    return WorkflowDetail(
        row=row,
        current_step=workflow.current_step_name,
        transitioned_at=workflow.transitioned_at,
        actions=controls,
        runnable_steps=[s.name for s in workflow.steps.runnable],
        plan=_plan(workflow, executions),
        timeline=_timeline(page.executions, shown_signals, actions, now),
        timeline_older=page.older,
        timeline_before=before if page.until is not None else None,
        signals=[signal_view(s) for s in signals],
        metadata=_json(metadata) if metadata else None,
        job_options=_json(job_options) if any(job_options.values()) else None,
        live=workflow.is_ongoing,
        awaited_signal=awaited_signal(workflow, executions),
        stranded_on=stranded_on,
        children=children_progress(children.counts(session, workflow.id)),
        children_by_state=children_by_state(session, workflow.id),
        parent_id=workflow.parent_id,
    )


#: The relationships panel's rows: a ``children.summaries`` key and its label, in this order.
_CHILD_KINDS = (
    (children.PAUSED_AFTER_ERROR, "paused after an error"),
    (WorkflowState.PAUSED, "paused"),
    (WorkflowState.READY, "running"),
    (WorkflowState.PERFORMING, "performing a step"),
    (WorkflowState.FINISHED, "finished"),
    (WorkflowState.CANCELED, "canceled"),
)


def children_by_state(session: Session, parent_id: int) -> list[tuple[str, int, dict[str, str]]]:
    """A parent's children by state for its relationships panel: ``(label, count, filter)``,
    those needing an operator first, each linking to the filtered children."""
    by_state = children.summaries(session, [parent_id]).get(parent_id, {})
    return [
        (label, by_state[key], children_filter(parent_id, key))
        for key, label in _CHILD_KINDS
        if by_state.get(key)
    ]


def children_progress(counts: dict[str, int]) -> str | None:
    """The children line of a parent's detail: "7 of 10 finished, 1 paused, 2 running" (and
    canceled ones, if any); None for a workflow without children."""
    total = sum(counts.values())
    if not total:
        return None
    parts = [f"{counts.get(WorkflowState.FINISHED, 0)} of {total} finished"]
    canceled = counts.get(WorkflowState.CANCELED, 0)
    if canceled:
        parts.append(f"{canceled} canceled")
    paused = counts.get(WorkflowState.PAUSED, 0)
    if paused:
        parts.append(f"{paused} paused")
    running = counts.get(WorkflowState.READY, 0) + counts.get(WorkflowState.PERFORMING, 0)
    if running:
        parts.append(f"{running} running")
    return ", ".join(parts)


@dataclass(frozen=True)
class TimedOutWait:
    """A row of the inbox's "Recently timed out": what was awaited, for how long, what then."""

    workflow_id: int
    workflow_class: str
    step_name: str
    #: The awaited signal (``payment_confirmed``), "child workflows", or None when the running
    #: code no longer defines the step.
    awaited: str | None
    waited: str
    then: str
    timed_out_at: datetime
    state: Badge


def timed_out_waits(session: Session, now: datetime | None = None) -> list[TimedOutWait]:
    """The waits that timed out lately, newest first (``/signals``)."""
    rows = []
    for execution, workflow in queries.recent_timeouts(session, now):
        definition = workflow.steps.named(execution.step_name)
        awaited: str | None = None
        then = "—"
        if definition is not None and definition.wait_for_children:
            awaited = "child workflows"
        elif definition is not None and definition.parks:
            awaited = str(definition.signal_matcher)
        if definition is not None and definition.on_timeout is not None:
            then = definition.on_timeout.value
        since = execution.waiting_since or execution.created_at
        deadline = execution.timeout_at or execution.timed_out_at or since
        rows.append(
            TimedOutWait(
                workflow_id=workflow.id,
                workflow_class=workflow.type,
                step_name=execution.step_name,
                awaited=awaited,
                waited=humanize_remaining(deadline - since),
                then=then,
                timed_out_at=execution.timed_out_at or deadline,
                state=state_badge(workflow.state),
            )
        )
    return rows


# --- definitions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDefinitionRow:
    name: str
    removed: bool
    options: list[str]
    in_flight: int
    ongoing: int


@dataclass(frozen=True)
class RenamedStepRow:
    """A ``renamed_step`` line: the old name, the step it runs as, what still refers to it."""

    old_name: str
    new_name: str
    in_flight: int


@dataclass(frozen=True)
class ClassDefinition:
    name: str
    python_name: str
    steps: list[StepDefinitionRow]
    cancel_if: list[str]
    policies: list[str]
    job_options: str | None
    may_proceed_without_hero: bool
    gravestones_in_flight: int
    renamed: list[RenamedStepRow] = field(default_factory=list)


def class_definition(session: Session, cls: type[Workflow]) -> ClassDefinition:
    in_flight = queries.removed_steps_current(session, cls)
    renamed_in_flight = cls.renamed_steps_in_flight(session)
    ongoing = queries.ongoing_per_step(session, cls.workflow_name)
    return ClassDefinition(
        name=cls.workflow_name,
        python_name=f"{cls.__module__}.{cls.__qualname__}",
        steps=[
            StepDefinitionRow(
                name=d.name,
                removed=d.removed,
                options=step_options(d),
                in_flight=in_flight.get(d.name, 0),
                ongoing=ongoing.get(d.name, 0),
            )
            for d in cls.steps
        ],
        cancel_if=[getattr(c, "__name__", str(c)) for c in cls._cancel_conditions],
        policies=[repr(p) for p in cls._exception_policies],
        job_options=_json(cls.class_step_job_options()) if cls.class_step_job_options() else None,
        may_proceed_without_hero=cls.may_proceed_without_hero,
        gravestones_in_flight=sum(in_flight.values()),
        renamed=[
            RenamedStepRow(old, new, renamed_in_flight.get(old, 0))
            for old, new in cls.steps.renamed.items()
        ],
    )


# --- signals inbox --------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiter:
    execution_id: int
    workflow_id: int
    workflow_class: str
    hero_type: str | None
    hero_id: str | None
    step_name: str
    waiting_since: datetime | None
    overdue: bool
    #: The workflow is paused: a signal sent now is stored, and the step runs after resume.
    paused: bool = False
    #: When the wait times out (docs/MANUAL.md, "Time-bounded waits") and what happens then; None without a time-out.
    times_out_at: datetime | None = None
    on_timeout: str | None = None


@dataclass(frozen=True)
class WaiterGroup:
    signal_name: str
    waiters: list[Waiter]
    paused: bool = False
    #: Parked on a step that no longer waits for a signal: nothing to deliver, no checkboxes.
    stranded: bool = False


_STRANDED = "(stranded: "


def waiter_groups(rows: list[tuple[StepExecution, Workflow]]) -> list[WaiterGroup]:
    """Parked executions grouped by the signal their step waits for (from the step definition),
    the waiters of paused workflows in groups of their own after the others: a signal reaches
    them only once they are resumed."""
    now = utcnow()
    groups: dict[tuple[bool, str], list[Waiter]] = {}
    for execution, workflow in rows:
        definition = workflow.steps.named(execution.step_name)
        if definition is None or definition.removed or not definition.waits_for_signal:
            # A step the code no longer waits in (a deploy renamed or deleted it): say so,
            # never "(unknown signal)" - housekeeping's next pass pauses it onto Stranded.
            name = f"{_STRANDED}`{execution.step_name}` no longer waits here)"
        else:
            # A matcher object of the user's own may have no ``.name``: its own words then.
            matcher = definition.signal_matcher
            name = matcher_name(matcher) or str(matcher)
        since = execution.waiting_since or execution.created_at
        paused = workflow.state == states.WorkflowState.PAUSED
        groups.setdefault((paused, name), []).append(
            Waiter(
                execution_id=execution.id,
                workflow_id=workflow.id,
                workflow_class=workflow.type,
                hero_type=workflow.hero_type,
                hero_id=workflow.hero_id,
                step_name=execution.step_name,
                waiting_since=since,
                overdue=lateness.is_waiting_too_long(execution, now),
                paused=paused,
                **_time_out(definition, execution),
            )
        )
    return [
        WaiterGroup(name, sorted(waiters, key=waiter_order), paused, name.startswith(_STRANDED))
        for (paused, name), waiters in sorted(groups.items())
    ]


def awaited_names(groups: list[WaiterGroup]) -> list[str]:
    """The signal names the inbox's waiters wait for (the bulk form's Name suggestions)."""
    return sorted({g.signal_name for g in groups if not g.stranded})


def _time_out(definition: Any, execution: StepExecution) -> dict[str, Any]:
    """A waiter's deadline and action, when its step (in the running code) still has one."""
    action = definition.on_timeout if definition is not None else None
    if action is None or execution.timeout_at is None:
        return {}
    return {"times_out_at": execution.timeout_at, "on_timeout": str(action)}


def waiter_order(waiter: Waiter) -> tuple[Any, ...]:
    """The inbox's order within a group: the most urgent first (DASHBOARD.md: lists that
    answer "how late" sort by it). Waiters with a time-out first, soonest first (docs/MANUAL.md, "Time-bounded waits");
    then, for waits without one, the overdue first and the longest waiting."""
    since = waiter.waiting_since
    deadline = waiter.times_out_at
    return (
        deadline is None,
        deadline.timestamp() if deadline is not None else 0.0,
        not waiter.overdue,
        since.timestamp() if since is not None else 0.0,
        waiter.workflow_id,
    )


def awaited_signal(workflow: Workflow, executions: list[StepExecution]) -> str | None:
    """The signal name the workflow's current (or next) step waits for, if it waits for one."""
    current = next((e for e in reversed(executions) if e.state == StepState.WAITING), None)
    step = current.step_name if current is not None else workflow.next_step_name
    definition = workflow.steps.named(step) if step else None
    matcher = definition.signal_matcher if definition is not None else None
    return matcher_name(matcher) if matcher is not None else None
