"""Unexplained workflows: the ones that fit no explanation of what they wait for (docs/MANUAL.md, "Changing workflows in production").

Every ongoing workflow has an explained next event: scheduled (when), waiting (for what, until
when), running (since when), paused (by whom, why). One that fits none of these will never
move by itself, and nothing says so. The rules below are the invariant checker's
(tests/reliability/invariants.py) that can be evaluated on a live database: each reads only
the live set through an index (current executions by ``(state, scheduled_for)``, workflows by
``(state, id)``), never finished history, and the listing is bounded by ``limit``.

A workflow that moved within :data:`GRACE` is never judged: an operator or a worker may be
between its two writes in another process, and the next look settles it.

:func:`unexplained` lists findings, each naming the rule it breaks and the fix;
:func:`counts` gives the per-class numbers behind the gauge
``geneva_drive_unexplained_workflows{workflow}`` (read with the other gauges, in the same
cached snapshot); :func:`run` is ``geneva-drive doctor``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, literal, select, union_all
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, aliased

from geneva_drive.config import settings
from geneva_drive.dialects.base import SubqueryFirst
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    TERMINAL_WORKFLOW_STATES,
    StepState,
    WorkflowState,
)
from geneva_drive.workflow import Workflow

#: What every rule selects: workflow id, workflow type, execution id (or NULL).
Rows = Select[Any, Any, Any]

#: A workflow that changed state more recently than this is not judged (see the docstring).
GRACE = timedelta(minutes=1)
#: The most findings :func:`unexplained` returns per rule by default.
DEFAULT_LIMIT = 100
#: The most workflows each rule contributes to :func:`counts` (the gauge).
COUNT_CAP = 10_000


@dataclass(frozen=True)
class Rule:
    name: str
    #: What an explained workflow would look like instead (the invariant).
    rule: str
    #: What to do, with ``{id}`` for the workflow's id, ``{execution}`` for the execution's,
    #: and ``{pause}`` for "wf.pause(); " unless the workflow is paused already (pause()
    #: refuses a paused workflow, and the fix is code an operator pastes).
    fix: str
    #: ``(now) -> SELECT workflow id, workflow type, execution id`` of the breaking workflows.
    query: Callable[[datetime], Rows]


@dataclass(frozen=True)
class Finding:
    workflow_id: int
    workflow_class: str
    rule: str
    problem: str
    fix: str
    execution_id: int | None = None


def _settled(now: datetime) -> Any:
    return func.coalesce(Workflow.transitioned_at, Workflow.created_at) < now - GRACE


def _current_exists(*states: str) -> Any:
    return (
        select(StepExecution.id)
        .where(StepExecution.workflow_id == Workflow.id, StepExecution.state.in_(states))
        .exists()
    )


def _ready_without_execution(now: datetime) -> Rows:
    return select(Workflow.id, Workflow.type, literal(None).label("execution_id")).where(
        Workflow.state == WorkflowState.READY,
        _settled(now),
        ~_current_exists(*CURRENT_STEP_STATES),
    )


def _performing_without_execution(now: datetime) -> Rows:
    # NOT IN over the running executions, not NOT EXISTS: the statistics of a table of history
    # put the running ones at about one row, so PostgreSQL nested-looped every performing
    # workflow over a scan of all running executions (2,000 x 2,000 rows: 127 ms at 10M
    # workflows); NOT IN hashes them once. workflow_id is NOT NULL, so NOT IN
    # cannot meet a NULL.
    running = select(StepExecution.workflow_id).where(StepExecution.state == StepState.IN_PROGRESS)
    return select(Workflow.id, Workflow.type, literal(None).label("execution_id")).where(
        Workflow.state == WorkflowState.PERFORMING,
        _settled(now),
        Workflow.id.not_in(running),
    )


def _sent_never_started(now: datetime) -> Rows:
    # Twice the dispatcher's resend window: a running dispatcher would have sent it again.
    cutoff = now - 2 * settings.dispatch_resend_after
    return (
        select(Workflow.id, Workflow.type, StepExecution.id)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state == StepState.SCHEDULED,
            StepExecution.scheduled_for < cutoff,
            StepExecution.sent_at < cutoff,
            Workflow.state == WorkflowState.READY,
        )
    )


def _current_step_outside_performing(now: datetime) -> Rows:
    return select(Workflow.id, Workflow.type, literal(None).label("execution_id")).where(
        Workflow.state.in_([WorkflowState.READY, WorkflowState.PAUSED]),
        Workflow.current_step_name.is_not(None),
        _settled(now),
    )


def _several_current(now: datetime) -> Rows:
    # The one-active unique index allows one scheduled or in-progress execution per workflow,
    # so several current ones always include a waiting one. Starting from the waiting
    # executions (parked ones: a small part of the live set) and counting only their
    # workflows' current executions through (workflow_id, state) costs the parked set; the
    # grouping of every current execution cost 0.25-1.4 s at B9's 250,000.
    parked = select(StepExecution.workflow_id).where(StepExecution.state == StepState.WAITING)
    several = (
        select(StepExecution.workflow_id, func.max(StepExecution.id).label("newest"))
        .where(
            StepExecution.state.in_(list(CURRENT_STEP_STATES)),
            SubqueryFirst(StepExecution.workflow_id, parked),
        )
        .group_by(StepExecution.workflow_id)
        .having(func.count() > 1)
        .subquery()
    )
    return select(Workflow.id, Workflow.type, several.c.newest).join(
        several, several.c.workflow_id == Workflow.id
    )


def _parked_holding_signal(now: datetime) -> Rows:
    return (
        select(Workflow.id, Workflow.type, StepExecution.id)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(StepExecution.state == StepState.WAITING, StepExecution.signal_id.is_not(None))
    )


def _terminal_with_live_execution(now: datetime) -> Rows:
    live = aliased(StepExecution)
    live_states = [StepState.WAITING, StepState.IN_PROGRESS]
    return (
        select(Workflow.id, Workflow.type, live.id)
        .join(Workflow, Workflow.id == live.workflow_id)
        .where(
            live.state.in_(live_states),
            # The live executions first, then their workflows by primary key: as a plain
            # join the planner hash-joined against every finished workflow.
            SubqueryFirst(
                Workflow.id,
                select(StepExecution.workflow_id).where(StepExecution.state.in_(live_states)),
            ),
            Workflow.state.in_(list(TERMINAL_WORKFLOW_STATES)),
            _settled(now),
        )
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "ready_without_execution",
        "a ready workflow has one scheduled or waiting execution (nothing else would run it)",
        "session.get(Workflow, {id}).reattempt()  # schedules its next step again",
        _ready_without_execution,
    ),
    Rule(
        "performing_without_execution",
        "a performing workflow has an execution in progress",
        "wf = session.get(Workflow, {id}); {pause}wf.resume()  # runs its step again",
        _performing_without_execution,
    ),
    Rule(
        "sent_never_started",
        "a due execution that was sent starts, or the dispatcher sends it again within "
        "dispatch_resend_after",
        "run the dispatcher (geneva-drive dispatcher, or celery beat) and a worker for the "
        "step's queue; it resends execution {execution}",
        _sent_never_started,
    ),
    Rule(
        "current_step_outside_performing",
        "current_step_name is set only while the workflow is performing",
        "wf = session.get(Workflow, {id}); {pause}wf.resume_at(wf.next_step_name)",
        _current_step_outside_performing,
    ),
    Rule(
        "several_current_executions",
        "a workflow has at most one scheduled, waiting or in-progress execution",
        "wf = session.get(Workflow, {id}); {pause}wf.resume_at(wf.next_step_name)  # keeps one",
        _several_current,
    ),
    Rule(
        "parked_holding_signal",
        "an execution parked for a signal holds none (a claimed signal wakes it)",
        "wf = session.get(Workflow, {id}); {pause}wf.resume()  # re-matches its signals",
        _parked_holding_signal,
    ),
    Rule(
        "terminal_with_live_execution",
        "a finished or canceled workflow has no waiting or running execution",
        "housekeeping's stuck recovery closes a running one; cancel a waiting one: "
        "geneva_drive.transitions.cancel_execution(session.get(StepExecution, {execution}))",
        _terminal_with_live_execution,
    ),
)


def unexplained(
    session: Session, now: datetime | None = None, limit: int = DEFAULT_LIMIT
) -> list[Finding]:
    """Every workflow that breaks a rule (at most ``limit`` per rule), oldest id first."""
    moment = now or utcnow()
    findings: list[Finding] = []
    for rule in RULES:
        query = rule.query(moment).order_by(Workflow.id).limit(limit)
        rows = list(session.execute(query))
        paused = _paused_ids(session, [int(row[0]) for row in rows])
        for workflow_id, type_name, execution_id in rows:
            execution = f"execution {execution_id}" if execution_id is not None else ""
            pause = "" if int(workflow_id) in paused else "wf.pause(); "
            findings.append(
                Finding(
                    workflow_id=int(workflow_id),
                    workflow_class=str(type_name),
                    rule=rule.name,
                    problem=f"breaks: {rule.rule}" + (f" ({execution})" if execution else ""),
                    fix=rule.fix.format(id=workflow_id, execution=execution_id, pause=pause),
                    execution_id=int(execution_id) if execution_id is not None else None,
                )
            )
    return findings


def _paused_ids(session: Session, ids: list[int]) -> set[int]:
    """Which of ``ids`` (at most one rule's ``limit``) are paused: their fix skips pause()."""
    if not ids:
        return set()
    query = select(Workflow.id).where(Workflow.id.in_(ids), Workflow.state == WorkflowState.PAUSED)
    return {int(i) for i in session.scalars(query)}


def counts(session: Session, now: datetime | None = None) -> dict[str, int]:
    """``{workflow class: unexplained workflows}`` (each workflow once, whatever it breaks).

    One statement. Each rule contributes at most :data:`COUNT_CAP` rows, so a pathological
    database (a bug that left every workflow unexplained) costs the gauge a bounded read.
    """
    moment = now or utcnow()
    parts = []
    for rule in RULES:
        capped = (
            rule.query(moment)
            .with_only_columns(Workflow.id.label("wid"), Workflow.type.label("wtype"))
            .limit(COUNT_CAP)
            .subquery()
        )
        parts.append(select(capped.c.wid, capped.c.wtype))
    every = union_all(*parts).subquery()
    rows = session.execute(
        select(every.c.wtype, func.count(func.distinct(every.c.wid))).group_by(every.c.wtype)
    )
    return {str(type_name): int(count) for type_name, count in rows}


# --- output -----------------------------------------------------------------------------------


def render(findings: list[Finding], as_json: bool = False) -> str:
    if as_json:
        return json.dumps({"ok": not findings, "unexplained": [asdict(f) for f in findings]})
    if not findings:
        return "doctor: OK - every ongoing workflow has an explained next event."
    lines = [f"doctor: {len(findings)} unexplained workflow(s):"]
    for f in findings:
        lines.append("")
        lines.append(f"  {f.workflow_class} #{f.workflow_id} [{f.rule}]")
        lines.append(f"    {f.problem}")
        lines.append(f"    fix: {f.fix}")
    return "\n".join(lines)


def exit_code(findings: list[Finding]) -> int:
    return 1 if findings else 0


def run(session: Session, as_json: bool = False) -> int:
    """``geneva-drive doctor``: 0 nothing unexplained, 1 findings, 2 could not check."""
    try:
        findings = unexplained(session)
    except SQLAlchemyError as error:
        print(f"doctor: could not check: {error}", file=sys.stderr)
        return 2
    print(render(findings, as_json=as_json))
    return exit_code(findings)


__all__ = [
    "GRACE",
    "RULES",
    "Finding",
    "Rule",
    "counts",
    "exit_code",
    "render",
    "run",
    "unexplained",
]
