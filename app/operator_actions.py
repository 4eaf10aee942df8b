"""Operator actions: call the engine inside ``db.session``, commit, and write the audit row.

Each action is one transaction: the engine call and its ``geneva_drive_operator_actions`` row
commit together. When the engine refuses (``InvalidStateError``, ``StepNotDefinedError``,
bad input, …) the transaction is rolled back, so nothing partial is written, and the refusal is
recorded in a transaction of its own: the audit log shows what was tried, not only what worked.

A bulk action has one outcome per id — ``done``, ``refused`` or ``gone`` (the workflow no
longer exists: deleted by housekeeping between preview and confirm, or a stale id) — recorded
in its batch row's ``params`` (``done_ids``, ``refused_ids``, ``gone_ids``), and the batch row
always ends finished (``ok``, ``partial``, ``refused`` or ``failed``), never left ``running``.

Operator input in log lines goes through :func:`geneva_drive.logsafe.escape`: a signal name
with a newline must not write a second, forged log line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import abort, current_app

from geneva_drive import instrumentation
from geneva_drive.dashboard.errors import REFUSALS, status_for
from geneva_drive.dashboard.extensions import db
from geneva_drive.logsafe import escape
from geneva_drive.models import OperatorAction, utcnow
from geneva_drive.serialization import compact_size, to_json_value
from geneva_drive.states import Operation
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    status: int
    message: str
    #: The workflow did not exist (only when the caller asked for a result instead of a 404).
    gone: bool = False

    @property
    def outcome(self) -> str:
        return "done" if self.ok else ("gone" if self.gone else "refused")


def parse_payload(text: str) -> Any:
    """The signal form's ``Payload (JSON)``: empty means ``{}``; anything else must be JSON."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Payload (JSON) is not valid JSON: {exc}") from exc
    except RecursionError:
        raise ValueError("Payload (JSON) is nested too deeply.") from None
    except ValueError:
        # Python refuses to parse integers longer than sys.get_int_max_str_digits() (4,300
        # digits by default: parsing them is quadratic); its own message would tell the
        # operator to change an interpreter setting.
        raise ValueError(
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
        raise ValueError("Choose the Step to resume at.")
    wf.resume_at(step)
    return f"Resumed at `{step}`."


def _signal(wf: Workflow, params: dict[str, Any]) -> str:
    name = str(params.get("name") or "").strip()
    if not name:
        raise ValueError("A signal needs a Name.")
    signal = wf.signal(name, params.get("payload"), idempotency_key=params.get("idempotency_key"))
    if signal.duplicate_delivery:
        return f"Signal `{name}` was already delivered with this idempotency key; nothing changed."
    return f"Signal `{name}` delivered ({signal.state})."


ACTIONS: dict[str, Callable[[Workflow, dict[str, Any]], str]] = {
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


def _audit_text(text: str) -> str:
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


def _record(
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
    row = OperatorAction(
        created_at=at or utcnow(),
        actor=actor,
        action=action,
        workflow_id=workflow_id,
        params=_audit_params(params, refused=result == "refused") or None,
        from_state=from_state,
        to_state=to_state,
        result=result,
        message=_audit_text(message),
    )
    db.session.add(row)
    # Feeds geneva_drive_operator_actions_total (geneva_drive.prometheus) and any other receiver.
    instrumentation.operator_action.send(
        "app", action=action, result=result, actor=actor, workflow_id=workflow_id
    )
    return row


def perform(
    actor: str,
    workflow_id: int,
    action: str,
    params: dict[str, Any] | None = None,
    *,
    audit_extra: dict[str, Any] | None = None,
    prepare: Callable[[], Any] | None = None,
    missing_ok: bool = False,
) -> ActionResult:
    """Run ``action`` on workflow ``workflow_id`` as ``actor``; 404 when it does not exist
    (with ``missing_ok``, a result with ``gone`` set instead: one id of a bulk action).

    ``prepare`` parses form input inside the refusal handling, so malformed input is a 400
    recorded like any other refusal.
    """
    params = dict(params or {})
    workflow = db.session.get(Workflow, workflow_id)
    if workflow is None:
        message = f"Workflow #{workflow_id} does not exist."
        if missing_ok:
            return ActionResult(False, 404, message + " It was deleted meanwhile.", gone=True)
        abort(404, description=message)
    from_state = workflow.state
    # Stamped with the time the action began, so in the timeline it precedes what it caused
    # (the execution resume_at creates, the step skip cancels).
    began = utcnow()
    audit_params = {**params, **(audit_extra or {})}
    try:
        if prepare is not None:
            params.update(prepare())
            audit_params.update(params)
        message = ACTIONS[action](workflow, params)
        db.session.flush()
        to_state = workflow.state
        _record(
            actor, action, workflow_id, audit_params, from_state, to_state, "ok", message, began
        )
        db.session.commit()
    except REFUSALS as exc:
        db.session.rollback()
        message = str(exc)
        _record(
            actor, action, workflow_id, audit_params, from_state, from_state, "refused", message
        )
        db.session.commit()
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
    return ActionResult(True, 200, message)


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


@dataclass
class _Tally:
    """Outcomes of a bulk action so far: counts, and the ids of each outcome."""

    counts: dict[str, int]
    ids: dict[str, list[int]]
    messages: list[str]
    #: None: every id is listed (a bulk action under the cap).
    listed: int | None = None

    @classmethod
    def new(cls, listed: int | None = None) -> _Tally:
        outcomes = ("done", "refused", "gone")
        return cls({o: 0 for o in outcomes}, {o: [] for o in outcomes}, [], listed)

    def add(self, workflow_id: int, result: ActionResult) -> None:
        self.counts[result.outcome] += 1
        ids = self.ids[result.outcome]
        if self.listed is None or len(ids) < self.listed:
            ids.append(workflow_id)
        if not result.ok and len(self.messages) < 10:
            self.messages.append(f"#{workflow_id}: {result.message}")

    def outcome(self, audit_id: int) -> BulkResult:
        counts = self.counts
        return BulkResult(
            counts["done"], counts["refused"], self.messages, audit_id, counts["gone"]
        )

    def params(self) -> dict[str, Any]:
        return {**self.counts, **{f"{name}_ids": ids for name, ids in self.ids.items()}}


def _finish(batch_id: int, tally: _Tally, result: str, message: str, **extra: Any) -> None:
    """Write the batch row's outcome in a transaction of its own."""
    batch = db.session.get(OperatorAction, batch_id)
    if batch is None:
        return
    batch.params = {**(batch.params or {}), **tally.params(), **extra}
    batch.result = result
    batch.message = _audit_text(message)
    db.session.commit()


def perform_bulk(
    actor: str, ids: list[int], action: str, params: dict[str, Any], selection: dict[str, Any]
) -> BulkResult:
    """Run ``action`` on each workflow, one transaction each, under one batch audit row.

    One transaction per workflow: a refusal on one (it changed state meanwhile) must not undo
    the others, and a workflow deleted meanwhile is "gone", not a 404 for the whole batch. Each
    workflow also gets its own audit row, so the action shows in its timeline. Should anything
    unexpected stop the loop, the batch row is still finished (``failed``, with what was done
    so far) before the error goes on to the error page.
    """
    batch = _record(
        actor, f"bulk_{action}", None, {**params, **selection}, None, None, "running", ""
    )
    db.session.commit()
    batch_id = batch.id
    tally = _Tally.new()
    try:
        for workflow_id in ids:
            result = perform(
                actor, workflow_id, action, params, audit_extra={"batch": batch_id}, missing_ok=True
            )
            tally.add(workflow_id, result)
    except BaseException:
        db.session.rollback()
        done = tally.outcome(batch_id)
        _finish(batch_id, tally, "failed", f"Stopped by an internal error after {done.summary}")
        log.exception("Bulk %s (batch %s) failed", action, batch_id)
        raise
    outcome = tally.outcome(batch_id)
    _finish(batch_id, tally, outcome.result, outcome.summary, count=len(ids))
    log.info(
        "Operator %s: bulk %s (batch %s): %s", escape(actor), action, batch_id, outcome.summary
    )
    return outcome


#: Rows a background bulk action handles between progress updates.
BACKGROUND_CHUNK = 200


def start_background_bulk(
    actor: str, action: str, params: dict[str, Any], filters: Any, selection: dict[str, Any]
) -> int:
    """Run a bulk action over a selection above the cap in a background thread; return the
    batch audit row's id, whose ``params`` carry the progress (``done``, ``refused``).

    A thread of the web process, not a queue: the work is bounded (one engine call per
    workflow) and its progress is in the database, so a restart mid-way leaves a "running"
    batch row and an operator who runs the same filter again. Each workflow is still its own
    transaction with its own audit row, exactly like a bulk action under the cap.
    """
    from geneva_drive.dashboard import queries

    batch = _record(
        actor,
        f"bulk_{action}",
        None,
        {**params, **selection, "background": True, "done": 0, "refused": 0},
        None,
        None,
        "running",
        "Running in the background.",
    )
    db.session.commit()
    batch_id = batch.id
    app = current_app._get_current_object()  # type: ignore[attr-defined]

    def run() -> None:
        with app.app_context():
            tally = _Tally.new(listed=BACKGROUND_IDS_LISTED)
            before: int | None = None
            try:
                while True:
                    ids = queries.ids_before(db.session(), filters, before, BACKGROUND_CHUNK)
                    if not ids:
                        break
                    for workflow_id in ids:
                        result = perform(
                            actor,
                            workflow_id,
                            action,
                            params,
                            audit_extra={"batch": batch_id},
                            missing_ok=True,  # deleted meanwhile (housekeeping): "gone"
                        )
                        tally.add(workflow_id, result)
                    before = ids[-1]
                    _finish(batch_id, tally, "running", "Running in the background.")
                outcome = tally.outcome(batch_id)
                _finish(batch_id, tally, outcome.result, outcome.summary)
            except Exception:
                # The thread has no caller to re-raise to: record the failure where the
                # operator is watching (the batch row), then log it with the traceback.
                db.session.rollback()
                _finish(batch_id, tally, "failed", "Stopped by an internal error.")
                log.exception("Background bulk %s (batch %s) failed", action, batch_id)
            finally:
                db.session.remove()

    thread = threading.Thread(target=run, name=f"geneva-bulk-{batch_id}", daemon=True)
    app.extensions.setdefault("geneva_bulk_threads", {})[batch_id] = thread
    thread.start()
    return batch_id
