"""Operator actions with an actor, audited: the one implementation behind the dashboard's
buttons, its bulk bar and the ``geneva-drive workflows …`` commands.

Every function takes the SQLAlchemy session to work in and the actor to record; none of them
knows about Flask, a request or a terminal. The dashboard passes its request session and the
signed-in user, the CLI its own session (:func:`geneva_drive.db.new_session`) and ``cli:<os
user>``.

Each action is one transaction: the engine call and its ``geneva_drive_operator_actions`` row
commit together. When the engine refuses (``InvalidStateError``, ``StepNotDefinedError``, bad
input, …) the transaction is rolled back, so nothing partial is written, and the refusal is
recorded in a transaction of its own: the audit log shows what was tried, not only what worked.

A bulk action has one outcome per id — ``done``, ``refused`` or ``gone`` (the workflow no
longer exists: deleted by housekeeping between preview and confirm, or a stale id) — recorded
in its batch row's ``params`` (``done_ids``, ``refused_ids``, ``gone_ids``), and the batch row
always ends finished (``ok``, ``partial``, ``refused`` or ``failed``), never left ``running``.
Its preview (:func:`preview_bulk`) counts the rows that will be done apart from those the
engine will refuse, with the reasons, from the same rules.

Operator input in log lines goes through :func:`geneva_drive.logsafe.escape`: a signal name
with a newline must not write a second, forged log line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import (
    children,
    instrumentation,
    operations,
    registry,
    schedules,
    scheduling,
    states,
)
from geneva_drive.errors import (
    CursorTooLargeError,
    DuplicateWorkflowError,
    EngineError,
    InvalidInputError,
    InvalidStateError,
    InvalidStateTransition,
    NoOngoingWorkflowError,
    SignalPayloadTooLargeError,
    StepNotDefinedError,
    WorkflowNotOngoing,
)
from geneva_drive.logsafe import escape
from geneva_drive.models import OperatorAction, Signal, StepExecution, utcnow
from geneva_drive.serialization import compact_size, to_json_value
from geneva_drive.signal_matcher import matcher_name
from geneva_drive.states import Operation, SignalState, StepState, WorkflowState
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

#: The engine said no: the request was fine, the workflow is not in a state that allows it.
CONFLICTS: tuple[type[Exception], ...] = (
    InvalidStateError,
    InvalidStateTransition,
    StepNotDefinedError,
    WorkflowNotOngoing,
    DuplicateWorkflowError,
)
#: The operator's input was malformed (the engine validates it and raises these).
BAD_INPUT: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    SignalPayloadTooLargeError,
    CursorTooLargeError,
)
#: Everything an operator action may refuse with.
REFUSALS = CONFLICTS + BAD_INPUT + (EngineError,)


def status_for(error: Exception) -> int:
    """The HTTP-style status of a refusal: 400 for malformed input, 409 for the engine's no."""
    return 400 if isinstance(error, BAD_INPUT) else 409


@dataclass(frozen=True)
class Done:
    """What an action did: its message, and data for callers that answer in JSON (the HTTP
    API: a signal's id, state and whether it was a duplicate delivery)."""

    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    #: 200 done, 400 malformed input, 404 gone, 409 refused by the engine (the dashboard
    #: answers with it; the CLI exits 1 on anything but 200).
    status: int
    message: str
    #: The workflow did not exist.
    gone: bool = False
    #: What the action returned besides its message (:class:`Done`); empty when refused.
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        return "done" if self.ok else ("gone" if self.gone else "refused")


def parse_payload(text: str) -> Any:
    """A signal's payload as typed by an operator: empty means ``{}``; anything else is JSON."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"Payload (JSON) is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidInputError("Payload (JSON) is nested too deeply.") from None
    except ValueError:
        # Python refuses to parse integers longer than sys.get_int_max_str_digits() (4,300
        # digits by default: parsing them is quadratic); its own message would tell the
        # operator to change an interpreter setting.
        raise InvalidInputError(
            f"Payload (JSON) holds a number longer than {sys.get_int_max_str_digits():,} "
            "digits; send such a value as a JSON string instead."
        ) from None


def _pause(wf: Workflow, params: dict[str, Any]) -> str:
    wf.pause()
    return "Paused."


def _resume(wf: Workflow, params: dict[str, Any]) -> str:
    wf.resume()
    return "Resumed."


def _skip(wf: Workflow, params: dict[str, Any]) -> str:
    step = wf.next_step_name
    wf.skip()
    return f"Skipped `{step}`."


def _cancel(wf: Workflow, params: dict[str, Any]) -> str:
    wf.cancel()
    return "Canceled."


def _reattempt(wf: Workflow, params: dict[str, Any]) -> str:
    wf.reattempt()
    return "Step scheduled to run again."


def _resume_at(wf: Workflow, params: dict[str, Any]) -> str:
    step = str(params.get("step") or "").strip()
    if not step:
        raise InvalidInputError("Choose the Step to resume at.")
    wf.resume_at(step)
    return f"Resumed at `{step}`."


def _deliver(wf: Workflow, params: dict[str, Any]) -> tuple[Signal, str]:
    name = str(params.get("name") or "").strip()
    if not name:
        raise InvalidInputError("A signal needs a Name.")
    waiting_only = bool(params.get(WAITING_ONLY))
    if waiting_only:
        # The inbox delivers only to a workflow still parked on this signal (its bulk deliver
        # and its rows' forms): checked under the workflow lock, which wf.signal() takes again
        # (a no-op the second time), so no step can claim or time out the wait in between.
        session = scheduling.session_of(wf)
        scheduling.lock_workflow(session, wf)
        parked = waiting_steps(session, [wf.id]).get(wf.id, [])
        reason = waiting_refusal(wf, name, parked, detail=True)
        if reason:
            raise InvalidStateError(
                f"Workflow #{wf.id} is {reason}; signal `{name}` was not delivered."
            )
    signal = wf.signal(name, params.get("payload"), idempotency_key=params.get("idempotency_key"))
    if signal.duplicate_delivery:
        return (
            signal,
            f"Signal `{name}` was already delivered with this idempotency key; nothing changed.",
        )
    if waiting_only and wf.state == WorkflowState.READY and signal.state == SignalState.PENDING:
        # Its step waits for this name narrowed by the payload, and this payload does not
        # match: buffering it is not what "deliver to the waiters" asked for. Refused, and the
        # caller's rollback leaves no signal row.
        raise InvalidStateError(
            f"Workflow #{wf.id} waits for `{name}` narrowed by its payload, and this payload "
            "does not match; nothing was delivered. Check the Payload (JSON)."
        )
    if signal.state == SignalState.PENDING and wf.state != WorkflowState.PAUSED:
        # Stored as the API stores it, but the operator is told that it wakes nothing now
        # (a parent parked on its children, a step parked on another signal): "delivered"
        # alone reads as if something had taken it.
        session = scheduling.session_of(wf)
        parked = waiting_steps(session, [wf.id]).get(wf.id, [])
        reason = waiting_refusal(wf, name, parked, detail=True) if parked else ""
        if reason:
            return signal, (
                f"Signal `{name}` stored (pending), but nothing waits for it: workflow "
                f"#{wf.id} is {reason}. It stays pending until a step that waits for `{name}` "
                "is reached."
            )
    return signal, f"Signal `{name}` delivered ({signal.state})."


def _signal(wf: Workflow, params: dict[str, Any]) -> Done:
    signal, message = _deliver(wf, params)
    return Done(
        message,
        {
            "signal_id": signal.id,
            "signal_state": str(signal.state),
            "duplicate_delivery": bool(signal.duplicate_delivery),
        },
    )


#: A ``signal`` parameter: deliver only to a workflow parked waiting for that signal (the
#: inbox's bulk deliver and row forms) and refuse the others, instead of buffering it.
WAITING_ONLY = "waiting_only"


def waiting_steps(session: Session, workflow_ids: list[int]) -> dict[int, list[str]]:
    """The steps each workflow is parked on (executions ``waiting`` for a signal)."""
    found: dict[int, list[str]] = {}
    for start in range(0, len(workflow_ids), _PREVIEW_CHUNK):
        chunk = workflow_ids[start : start + _PREVIEW_CHUNK]
        rows = session.execute(
            select(StepExecution.workflow_id, StepExecution.step_name)
            .where(StepExecution.workflow_id.in_(chunk), StepExecution.state == StepState.WAITING)
            .order_by(StepExecution.id)
        )
        for workflow_id, step_name in rows:
            found.setdefault(int(workflow_id), []).append(str(step_name))
    return found


def awaited_signals(workflow: Workflow, steps: list[str]) -> list[str]:
    """The signal names ``workflow``'s parked steps wait for (in the running code)."""
    names: list[str] = []
    for step in steps:
        definition = workflow.steps.named(step)
        if definition is None or definition.removed or not definition.waits_for_signal:
            continue
        name = matcher_name(definition.signal_matcher)
        if name is not None and name not in names:
            names.append(name)
    return names


def waiting_refusal(
    workflow: Workflow, name: str, steps: list[str], *, detail: bool = False
) -> str:
    """Why ``workflow`` is not waiting for signal ``name`` ("" when it is), given the steps it
    is parked on. Reads after "Workflow #N is" and after a count in a preview ("2 no longer
    waiting for a signal (ready)"); ``detail`` adds what only reads well for one workflow (a
    join's open children), which a preview's grouped reasons leave out."""
    if not steps or not states.can_signal(workflow.state):
        return f"no longer waiting for a signal ({workflow.state})"
    awaited = awaited_signals(workflow, steps)
    if name in awaited:
        return ""
    if not awaited:
        if any(children.is_join(workflow, step) for step in steps):
            # A join parks in "waiting" too (docs/MANUAL.md, "Fan-out and join: child workflows"); it is not stranded.
            open_count = f" ({workflow.children_open} open)" if detail else ""
            return f"waiting for its child workflows{open_count}, not for a signal"
        return f"parked on `{steps[0]}`, which no longer waits for a signal"
    return f"waiting for {', '.join(f'`{a}`' for a in awaited)}, not `{name}`"


ACTIONS: dict[str, Callable[[Workflow, dict[str, Any]], str | Done]] = {
    Operation.PAUSE: _pause,
    Operation.RESUME: _resume,
    Operation.SKIP: _skip,
    Operation.CANCEL: _cancel,
    Operation.REATTEMPT: _reattempt,
    Operation.RESUME_AT: _resume_at,
    Operation.SIGNAL: _signal,
}


#: Largest value (bytes of JSON) a refused action's audit row keeps verbatim.
AUDIT_REFUSED_VALUE_LIMIT = 2048


def audit_text(text: str) -> str:
    """Text every backend stores: no NUL, no lone surrogates (both come from raw input)."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _audit_params(params: dict[str, Any] | None, *, refused: bool) -> dict[str, Any]:
    """What the audit row keeps of the input. A refusal keeps only what can be stored and is
    small: input the engine refused (too large, not storable) is summarized, never copied, so
    the audit log cannot become the store for what the engine turned away."""
    safe: dict[str, Any] = {}
    for key, value in (params or {}).items():
        try:
            data = to_json_value(value, path=str(key))
            size = compact_size(data)
        except (TypeError, ValueError, RecursionError):
            safe[key] = f"(not stored: a {type(value).__name__} that cannot be stored)"
            continue
        if refused and size > AUDIT_REFUSED_VALUE_LIMIT:
            safe[key] = f"(not stored: {size} bytes)"
        else:
            safe[key] = value
    return safe


def record(
    session: Session,
    actor: str,
    action: str,
    workflow_id: int | None,
    params: dict[str, Any] | None,
    from_state: str | None,
    to_state: str | None,
    result: str,
    message: str,
    at: datetime | None = None,
) -> OperatorAction:
    """Add an audit row to ``session`` (the caller commits) and tell the instrumentation."""
    row = OperatorAction(
        created_at=at or utcnow(),
        actor=actor,
        action=action,
        workflow_id=workflow_id,
        params=_audit_params(params, refused=result == "refused") or None,
        from_state=from_state,
        to_state=to_state,
        result=result,
        message=audit_text(message),
    )
    session.add(row)
    # Feeds geneva_drive_operator_actions_total (geneva_drive.prometheus) and any other receiver.
    instrumentation.operator_action.send(
        "app", action=action, result=result, actor=actor, workflow_id=workflow_id
    )
    return row


def perform(
    session: Session,
    actor: str,
    workflow_id: int,
    action: str,
    params: dict[str, Any] | None = None,
    *,
    audit_extra: dict[str, Any] | None = None,
    prepare: Callable[[], Any] | None = None,
) -> ActionResult:
    """Run ``action`` on workflow ``workflow_id`` as ``actor`` in ``session``, audited, and
    commit. A workflow that does not exist is a result with ``gone`` set (nothing recorded).

    ``prepare`` parses raw input inside the refusal handling, so malformed input is a refusal
    recorded like any other.
    """
    if action not in ACTIONS:
        raise InvalidInputError(f"Unknown operator action {action!r}; known: {', '.join(ACTIONS)}.")
    params = dict(params or {})
    workflow = session.get(Workflow, workflow_id)
    if workflow is None:
        return ActionResult(False, 404, f"Workflow #{workflow_id} does not exist.", gone=True)
    from_state = workflow.state
    # Stamped with the time the action began, so in the timeline it precedes what it caused
    # (the execution resume_at creates, the step skip cancels).
    began = utcnow()
    audit_params = {**params, **(audit_extra or {})}
    try:
        if prepare is not None:
            params.update(prepare())
            audit_params.update(params)
        done = ACTIONS[action](workflow, params)
        message, data = (done.message, done.data) if isinstance(done, Done) else (done, {})
        session.flush()
        to_state = workflow.state
        record(
            session,
            actor,
            action,
            workflow_id,
            audit_params,
            from_state,
            to_state,
            "ok",
            message,
            began,
        )
        session.commit()
    except REFUSALS as exc:
        session.rollback()
        message = str(exc)
        record(
            session,
            actor,
            action,
            workflow_id,
            audit_params,
            from_state,
            from_state,
            "refused",
            message,
        )
        session.commit()
        log.info(
            "Operator %s: %s on workflow %s refused: %s",
            escape(actor),
            action,
            workflow_id,
            escape(message),
        )
        return ActionResult(False, status_for(exc), message)
    log.info(
        "Operator %s: %s on workflow %s: %s", escape(actor), action, workflow_id, escape(message)
    )
    return ActionResult(True, 200, message, data=data)


def perform_hero_signal(
    session: Session,
    actor: str,
    workflow_class: str,
    hero_type: str,
    hero_id: str,
    params: dict[str, Any],
) -> ActionResult:
    """Deliver a signal to the ongoing workflow of ``workflow_class`` for the hero
    ``hero_type``/``hero_id`` (a webhook's shape), as :func:`perform` would to that workflow.

    A class this process does not know is bad input (400); no ongoing workflow for that hero
    is a 404 and several (``allow_multiple``) a 409, each recorded as a refused ``signal``
    with the class and hero in its parameters, as every refusal is.
    """
    target = {"workflow": workflow_class, "hero_type": hero_type, "hero_id": hero_id}
    cls = registry.workflow_class(workflow_class)
    try:
        if cls is None:
            known = ", ".join(sorted(registry.registered_workflows())) or "(none)"
            raise InvalidInputError(
                f"workflow {workflow_class!r} is not a workflow class of this application; "
                f"known: {known}"
            )
        workflow = cls.ongoing_for_hero(session, (hero_type, hero_id))
    except (InvalidInputError, InvalidStateError, NoOngoingWorkflowError) as exc:
        session.rollback()
        status = 404 if isinstance(exc, NoOngoingWorkflowError) else status_for(exc)
        record(
            session,
            actor,
            Operation.SIGNAL,
            None,
            {**params, **target},
            None,
            None,
            "refused",
            str(exc),
        )
        session.commit()
        log.info("Operator %s: signal by hero refused: %s", escape(actor), escape(str(exc)))
        return ActionResult(False, status, str(exc), gone=status == 404)
    return perform(session, actor, workflow.id, Operation.SIGNAL, params, audit_extra=target)


# --- bulk ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BulkResult:
    done: int
    refused: int
    messages: list[str]
    audit_id: int
    gone: int = 0

    @property
    def summary(self) -> str:
        text = f"{self.done} done"
        if self.refused:
            text += f", {self.refused} refused"
        if self.gone:
            text += f", {self.gone} no longer exist"
        return text + "."

    @property
    def result(self) -> str:
        """The batch row's result: all done (or nothing left to do), some, or none."""
        if not self.refused:
            return "ok"
        return "partial" if self.done else "refused"


#: Ids per outcome a background batch row lists (its workflows' own audit rows hold the rest;
#: the row is rewritten after every chunk, so it must stay small).
BACKGROUND_IDS_LISTED = 1000
#: Rows a background bulk action handles between progress updates.
BACKGROUND_CHUNK = 200


@dataclass
class Tally:
    """Outcomes of a bulk action so far: counts, and the ids of each outcome."""

    counts: dict[str, int]
    ids: dict[str, list[int]]
    messages: list[str]
    #: None: every id is listed (a bulk action under the cap).
    listed: int | None = None

    @classmethod
    def new(cls, listed: int | None = None) -> Tally:
        outcomes = ("done", "refused", "gone")
        return cls({o: 0 for o in outcomes}, {o: [] for o in outcomes}, [], listed)

    def add(self, workflow_id: int, result: ActionResult) -> None:
        self.counts[result.outcome] += 1
        ids = self.ids[result.outcome]
        if self.listed is None or len(ids) < self.listed:
            ids.append(workflow_id)
        if not result.ok and len(self.messages) < 10:
            message = result.message + (" It was deleted meanwhile." if result.gone else "")
            self.messages.append(f"#{workflow_id}: {message}")

    def outcome(self, audit_id: int) -> BulkResult:
        counts = self.counts
        return BulkResult(
            counts["done"], counts["refused"], self.messages, audit_id, counts["gone"]
        )

    def params(self) -> dict[str, Any]:
        return {**self.counts, **{f"{name}_ids": ids for name, ids in self.ids.items()}}


def finish_batch(
    session: Session, batch_id: int, tally: Tally, result: str, message: str, **extra: Any
) -> None:
    """Write the batch row's outcome in a transaction of its own."""
    batch = session.get(OperatorAction, batch_id)
    if batch is None:
        return
    batch.params = {**(batch.params or {}), **tally.params(), **extra}
    batch.result = result
    batch.message = audit_text(message)
    session.commit()


def start_batch(
    session: Session,
    actor: str,
    action: str,
    params: dict[str, Any],
    selection: dict[str, Any],
    *,
    message: str = "",
) -> int:
    """Write (and commit) the ``bulk_<action>`` row, ``running``; return its id."""
    batch = record(
        session,
        actor,
        f"bulk_{action}",
        None,
        {**params, **selection},
        None,
        None,
        "running",
        message,
    )
    session.commit()
    return batch.id


def run_batch(
    session: Session,
    actor: str,
    action: str,
    params: dict[str, Any],
    batch_id: int,
    ids: Iterable[int],
    tally: Tally,
) -> None:
    """Run ``action`` on each id, one transaction and one audit row each, tallied."""
    for workflow_id in ids:
        result = perform(
            session, actor, workflow_id, action, params, audit_extra={"batch": batch_id}
        )
        tally.add(workflow_id, result)


def perform_bulk(
    session: Session,
    actor: str,
    ids: list[int],
    action: str,
    params: dict[str, Any],
    selection: dict[str, Any],
) -> BulkResult:
    """Run ``action`` on each workflow, one transaction each, under one batch audit row.

    One transaction per workflow: a refusal on one (it changed state meanwhile) must not undo
    the others, and a workflow deleted meanwhile is "gone", not a failure of the whole batch.
    Each workflow also gets its own audit row, so the action shows in its timeline. Should
    anything unexpected stop the loop, the batch row is still finished (``failed``, with what
    was done so far) before the error goes on.
    """
    batch_id = start_batch(session, actor, action, params, selection)
    tally = Tally.new()
    try:
        run_batch(session, actor, action, params, batch_id, ids, tally)
    except BaseException:
        session.rollback()
        done = tally.outcome(batch_id)
        finish_batch(
            session, batch_id, tally, "failed", f"Stopped by an internal error after {done.summary}"
        )
        log.exception("Bulk %s (batch %s) failed", action, batch_id)
        raise
    outcome = tally.outcome(batch_id)
    finish_batch(session, batch_id, tally, outcome.result, outcome.summary, count=len(ids))
    log.info(
        "Operator %s: bulk %s (batch %s): %s", escape(actor), action, batch_id, outcome.summary
    )
    return outcome


def run_background_batch(
    session: Session,
    actor: str,
    action: str,
    params: dict[str, Any],
    batch_id: int,
    next_ids: Callable[[Session, int | None], list[int]],
) -> None:
    """Run a bulk action over a selection too large for one request, chunk by chunk.

    ``next_ids(session, before)`` gives the next chunk of ids below ``before`` (newest first;
    empty when done). Progress lands on the batch row after every chunk, so a restart mid-way
    leaves a ``running`` row with what was done. Errors are recorded on the row and logged, not
    raised: a background runner has no caller to raise to.
    """
    tally = Tally.new(listed=BACKGROUND_IDS_LISTED)
    before: int | None = None
    try:
        while True:
            ids = next_ids(session, before)
            if not ids:
                break
            run_batch(session, actor, action, params, batch_id, ids, tally)
            before = ids[-1]
            finish_batch(session, batch_id, tally, "running", "Running in the background.")
        outcome = tally.outcome(batch_id)
        finish_batch(session, batch_id, tally, outcome.result, outcome.summary)
    except Exception:
        session.rollback()
        finish_batch(session, batch_id, tally, "failed", "Stopped by an internal error.")
        log.exception("Background bulk %s (batch %s) failed", action, batch_id)


# --- preview -------------------------------------------------------------------------------------


#: Why each action refuses a workflow in a state that does not allow it (the preview's words).
_STATE_RULES: dict[str, tuple[Callable[[str], bool], str]] = {
    Operation.PAUSE: (states.can_pause, "only a ready or performing workflow can be paused"),
    Operation.RESUME: (states.can_resume, "only a paused workflow can be resumed"),
    Operation.SKIP: (states.can_skip, "only a ready or paused workflow can skip its step"),
    Operation.CANCEL: (states.can_cancel, "only an ongoing workflow can be canceled"),
    Operation.REATTEMPT: (
        lambda state: state in (WorkflowState.READY, WorkflowState.PAUSED),
        "only a ready or paused workflow can run its step again",
    ),
    Operation.RESUME_AT: (
        states.can_resume_at,
        "only a paused workflow can be resumed at a step; pause it first",
    ),
    Operation.SIGNAL: (states.can_signal, "a finished or canceled workflow takes no signals"),
}


def refusal_reason(workflow: Workflow, action: str, params: dict[str, Any] | None = None) -> str:
    """Why the engine will refuse ``action`` on ``workflow`` ("" when it will not), judged
    before the lock from the same rules the engine applies (:mod:`geneva_drive.states`, the
    class's steps). The reason names no workflow, so equal reasons group in a preview, and
    reads after a count: "3 ready (only a paused workflow can be resumed)"."""
    params = params or {}
    allowed, rule = _STATE_RULES[action]
    if not allowed(workflow.state):
        return f"{workflow.state} ({rule})"
    cls = type(workflow)
    if action == Operation.RESUME_AT:
        step = str(params.get("step") or "").strip()
        definition = cls.steps.named(step) if step else None
        if definition is None or definition.removed:
            runnable = ", ".join(s.name for s in cls.steps.runnable) or "(none)"
            return f"not resumable at `{step}` ({workflow.type}'s steps: {runnable})"
    if action in (Operation.RESUME, Operation.REATTEMPT) and workflow.state == WorkflowState.PAUSED:
        if not cls.steps.runnable:
            # Its class is not loaded (or gone): the engine refuses to resume it as stranded.
            return (
                f"of a class not loaded here ({workflow.type}: set GENEVA_WORKFLOW_MODULES, "
                "or use resume-at or cancel)"
            )
        if operations.stranded_step(scheduling.session_of(workflow), workflow) is not None:
            # Stranded on a step its class no longer defines: the engine refuses to resume it.
            return f"stranded on a step {workflow.type} no longer defines (use resume-at or cancel)"
    if action == Operation.REATTEMPT and workflow.state == WorkflowState.READY:
        if operations.unrunnable_current_step(workflow) is not None:
            # The engine refuses to run again a step the class no longer defines.
            return (
                f"on a step {workflow.type} no longer defines (pause it, then resume-at or cancel)"
            )
    if action == Operation.SIGNAL and not str(params.get("name") or "").strip():
        return "without a signal name (a signal needs a name)"
    return ""


@dataclass(frozen=True)
class BulkPreview:
    """What a bulk action would do: the ids it will act on, those the engine will refuse (with
    the reasons, grouped), and those that no longer exist."""

    eligible: list[int]
    refused: dict[str, list[int]] = field(default_factory=dict)
    gone: list[int] = field(default_factory=list)
    #: Eligible ids of paused workflows: a signal to them is stored until they are resumed.
    held: list[int] = field(default_factory=list)

    @property
    def refused_count(self) -> int:
        return sum(len(ids) for ids in self.refused.values())

    @property
    def refused_ids(self) -> list[int]:
        return sorted((i for ids in self.refused.values() for i in ids), reverse=True)

    @property
    def not_done(self) -> int:
        """Rows the action will not change: refused, or no longer there."""
        return self.refused_count + len(self.gone)

    def reasons(self) -> list[str]:
        """Why the rest will not be done, counted: ["3 ready (only a paused workflow can be
        resumed)", "1 no longer exists"]. The dashboard and the CLI print these."""
        parts = [f"{len(ids):,} {reason}" for reason, ids in self.refused.items()]
        if self.gone:
            parts.append(f"{len(self.gone):,} no longer exist{'s' if len(self.gone) == 1 else ''}")
        return parts


#: Ids per query when a preview loads its workflows (well under every backend's bind limit).
_PREVIEW_CHUNK = 500


def preview_bulk(
    session: Session, ids: list[int], action: str, params: dict[str, Any] | None = None
) -> BulkPreview:
    """Sort ``ids`` into those ``action`` will change and those it will refuse, changing
    nothing (reads only, no lock: the action itself rechecks under the lock)."""
    if action not in ACTIONS:
        raise InvalidInputError(f"Unknown operator action {action!r}; known: {', '.join(ACTIONS)}.")
    found: dict[int, Workflow] = {}
    for start in range(0, len(ids), _PREVIEW_CHUNK):
        chunk = ids[start : start + _PREVIEW_CHUNK]
        for row in session.scalars(select(Workflow).where(Workflow.id.in_(chunk))):
            found[row.id] = row
    eligible: list[int] = []
    refused: dict[str, list[int]] = {}
    gone: list[int] = []
    held: list[int] = []
    waiting_only = action == Operation.SIGNAL and bool((params or {}).get(WAITING_ONLY))
    parked = waiting_steps(session, list(found)) if waiting_only else {}
    name = str((params or {}).get("name") or "").strip()
    for workflow_id in ids:
        workflow = found.get(workflow_id)
        if workflow is None:
            gone.append(workflow_id)
            continue
        reason = refusal_reason(workflow, action, params)
        if waiting_only and not reason:
            reason = waiting_refusal(workflow, name, parked.get(workflow_id, []))
        if reason:
            refused.setdefault(reason, []).append(workflow_id)
        else:
            eligible.append(workflow_id)
            if waiting_only and workflow.state == WorkflowState.PAUSED:
                held.append(workflow_id)
    return BulkPreview(eligible, refused, gone, held)


# --- schedules -----------------------------------------------------------------------------------


#: The operator actions on a schedule (their audit names; ``params`` ``{"schedule": name}``):
#: the dashboard's Pause / Resume / Run now on /schedules and ``geneva-drive schedules …``.
SCHEDULE_ACTIONS = ("schedule_pause", "schedule_resume", "schedule_run_now")


@dataclass(frozen=True)
class ScheduleActionResult(ActionResult):
    """An :class:`ActionResult` of a schedule action; ``workflow_id`` is the workflow Run now
    created (None for the other actions and for a refusal)."""

    workflow_id: int | None = None


def schedule_state(row: Any) -> str:
    """What the audit's from/to columns say of a schedule: ``disabled``, ``paused`` or
    ``active``."""
    if row.disabled_at is not None:
        return "disabled"
    return "paused" if row.paused else "active"


def perform_schedule(
    session: Session, actor: str, name: str, action: str, now: datetime | None = None
) -> ScheduleActionResult:
    """Run schedule ``action`` (one of :data:`SCHEDULE_ACTIONS`) on the schedule ``name`` as
    ``actor`` in ``session``, audited, and commit - like :func:`perform` for a workflow.

    A schedule that does not exist is a result with ``gone`` set (nothing recorded). The
    engine's refusals (``InvalidStateError``: paused already, not paused, disabled, the
    previous run still going under ``overlap="skip"``) roll back and are recorded as refused.
    Run now's audit row carries the workflow it created, so it shows in that workflow's
    timeline too.
    """
    if action not in SCHEDULE_ACTIONS:
        known = ", ".join(SCHEDULE_ACTIONS)
        raise InvalidInputError(f"Unknown schedule action {action!r}; known: {known}.")
    params = {"schedule": name}
    began = utcnow()
    try:
        # Read under the row's lock (the action below locks it again, a no-op): what the audit
        # says it was is what the action saw.
        from_state = schedule_state(schedules.named(session, name, lock=True))
    except LookupError as exc:
        session.rollback()
        return ScheduleActionResult(False, 404, str(exc), gone=True)
    workflow_id: int | None = None
    try:
        if action == "schedule_pause":
            row = schedules.pause(session, name)
            message = f"Paused schedule `{name}`: it fires nothing until resumed."
        elif action == "schedule_resume":
            row = schedules.resume(session, name)
            message = (
                f"Resumed schedule `{name}`; ticks missed while paused follow "
                f"catch_up={row.catch_up} at the next sweep."
            )
        else:
            workflow = schedules.run_now(session, name, now or began)
            row = schedules.named(session, name, lock=True)
            workflow_id = workflow.id
            message = f"Schedule `{name}` ran now: created {workflow.type} #{workflow.id}."
        session.flush()
        record(
            session,
            actor,
            action,
            workflow_id,
            params,
            from_state,
            schedule_state(row),
            "ok",
            message,
            began,
        )
        session.commit()
    except REFUSALS as exc:
        session.rollback()
        message = str(exc)
        record(session, actor, action, None, params, from_state, from_state, "refused", message)
        session.commit()
        log.info(
            "Operator %s: %s on schedule %s refused: %s",
            escape(actor),
            action,
            escape(name),
            escape(message),
        )
        return ScheduleActionResult(False, status_for(exc), message)
    log.info(
        "Operator %s: %s on schedule %s: %s", escape(actor), action, escape(name), escape(message)
    )
    return ScheduleActionResult(True, 200, message, workflow_id=workflow_id)
