"""Operator actions (POST only; CSRF and the operator role are checked before any view runs).

HTMX requests get the re-rendered live region plus an ``HX-Trigger`` toast; plain form posts
get POST/redirect/GET on success, and the page re-rendered with the refusal inline (409/400)
when the engine says no, so the message sits next to the control either way.
"""

from __future__ import annotations

from typing import Any

from flask import abort, flash, make_response, redirect, request

from geneva_drive.dashboard import operator_actions, presenters, queries
from geneva_drive.dashboard.auth import current_user
from geneva_drive.dashboard.extensions import db, session
from geneva_drive.dashboard.htmx import STOP_POLLING, is_htmx, render, with_trigger
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.dashboard.state import dashboard_config
from geneva_drive.dashboard.urls import url_for
from geneva_drive.dashboard.workflows import bp
from geneva_drive.dashboard.workflows.views import list_context, load_workflow, render_detail
from geneva_drive.models import OperatorAction
from geneva_drive.serialization import serialize_payload
from geneva_drive.signals import MAX_NAME_LENGTH
from geneva_drive.states import Operation

SIMPLE_ACTIONS = tuple(op for op in Operation if op != Operation.SIGNAL)


def _actor() -> str:
    user = current_user()
    assert user is not None  # auth.authorize() refused anonymous POSTs already
    return user.actor  # a host user under their stable id: a chosen name cannot pose as another


def _respond(
    workflow_id: int,
    result: operator_actions.ActionResult,
    signal_draft: dict[str, Any] | None = None,
) -> Any:
    if not is_htmx() and result.ok:
        flash(result.message)
        return redirect(url_for("workflows.detail", workflow_id=workflow_id))
    db.session.expire_all()
    workflow = load_workflow(workflow_id)
    response = render_detail(
        workflow,
        status=result.status,
        refusal=None if result.ok else result.message,
        notice=result.message if result.ok else None,
        signal_draft=None if result.ok else signal_draft,
    )
    return with_trigger(response, "geneva:toast", {"message": result.message, "ok": result.ok})


def _action_view(action: str) -> Any:
    def view(workflow_id: int) -> Any:
        params = {"step": request.form.get("step", "")} if action == "resume_at" else {}
        return _respond(
            workflow_id, operator_actions.perform(_actor(), workflow_id, action, params)
        )

    view.__name__ = action
    return view


for _name in SIMPLE_ACTIONS:
    bp.add_url_rule(
        f"/workflows/<int:workflow_id>/{_name}",
        endpoint=_name,
        view_func=_action_view(_name),
        methods=["POST"],
    )


@bp.post("/workflows/<int:workflow_id>/signals")
def signal(workflow_id: int) -> Any:
    form = request.form
    key = form.get("idempotency_key", "").strip() or None
    params: dict[str, Any] = {"name": form.get("name", "").strip(), "idempotency_key": key}
    if form.get("back") == "signals":
        # From an inbox row: deliver only while it still waits for that signal; a wrong Name
        # or a waiter that moved on meanwhile is refused next to the form, nothing buffered.
        params[operator_actions.WAITING_ONLY] = True
    raw_payload = form.get("payload", "")
    result = operator_actions.perform(
        _actor(),
        workflow_id,
        "signal",
        params,
        prepare=lambda: {"payload": operator_actions.parse_payload(raw_payload)},
    )
    back = form.get("back")
    # What the operator typed, kept for the form when the send is refused (a bad JSON payload
    # must not send them back to an empty "{}").
    draft = {
        "workflow_id": workflow_id,
        "name": params["name"],
        "payload": raw_payload,
        "key": key or "",
        "message": result.message,
        "field": _signal_error_field(result.message),
    }
    if back == "signals" and result.ok and not is_htmx():
        flash(f"#{workflow_id}: {result.message}")
        return redirect(url_for("dashboard.signals"))
    if back == "signals" and is_htmx():
        # Sent from the inbox: the inbox is re-rendered in place (the waiter leaves it), with
        # the outcome at its top, like every other action updates its own region.
        from geneva_drive.dashboard.dashboard.views import signals_context

        db.session.expire_all()
        message = f"#{workflow_id}: {result.message}"
        response = render(
            "dashboard/signals.html",
            "dashboard/_signals.html",
            status=result.status,
            inbox_message=message,
            inbox_ok=result.ok,
            signal_draft=None if result.ok else draft,
            **signals_context(),
        )
        return with_trigger(response, "geneva:toast", {"message": message, "ok": result.ok})
    return _respond(workflow_id, result, draft)


def _signal_error_field(message: str) -> str:
    """The field a refused send's message belongs next to: the payload's, the name's, or the
    form's top (the workflow's state)."""
    if message.startswith("Payload (JSON)") or "payload" in message.lower():
        return "payload"
    if ", not `" in message or "signal name" in message or "needs a Name" in message:
        return "name"
    return ""


# --- bulk -------------------------------------------------------------------------------------


def _selection(source: Any) -> tuple[queries.WorkflowFilters, list[int], str, bool]:
    """The filters, the ids (at most cap + 1), an error, and whether it runs in the background
    (all matching the filter, over the cap)."""
    filters = queries.WorkflowFilters.from_args(source)
    cap = int(dashboard_config()["BULK_CAP"])
    scope = source.get("scope", "selected")
    error = ""
    if scope == "all":
        ids = queries.capped_ids(session(), filters, cap)
    else:
        ids = []
        for raw in source.getlist("ids"):
            workflow_id = queries.parse_id(raw)
            if workflow_id is not None:
                ids.append(workflow_id)
        ids = sorted(set(ids), reverse=True)
        if not ids:
            error = "Select workflows first, or choose all workflows matching the filter."
    background = False
    if len(ids) > cap and scope == "all":
        background = True
    elif len(ids) > cap:
        error = (
            f"More than {cap:,} workflows are selected; select at most {cap:,} rows, or choose "
            "all workflows matching the filter to run it in the background."
        )
    return filters, ids, error, background


def _bulk_context(source: Any, *, preview_rows: bool = True) -> dict[str, Any]:
    action = source.get("action", "")
    # The signal inbox's bulk deliver: the engine's signal action, only to workflows still
    # parked on that signal (not one of the list's bulk bar buttons).
    deliver = action == Operation.SIGNAL and source.get("origin") == "signals"
    if action not in presenters.BULK_ACTIONS and not deliver:
        return {
            "error": "Unknown bulk action: choose one of the bulk bar's buttons.",
            "status": 400,
            "back_url": url_for("workflows.index"),
            "in_dialog": is_htmx(),
        }
    filters, ids, error, background = _selection(source)
    target_step = source.get("target_step", "").strip()
    if action == "resume_at" and not target_step and not error:
        error = "Choose the Step to resume at."
    params: dict[str, Any] = {"step": target_step} if action == "resume_at" else {}
    field_errors: dict[str, str] = {}
    if deliver:
        if source.get("scope") == "all" or background:
            error = error or "Select the waiters to send the signal to (at most one page)."
            background = False
        params, field_errors = _signal_params(source)
        if not ids:
            error = "Select the waiters to send the signal to first (the boxes in the rows)."
        error = error or next(iter(field_errors.values()), "")
    label, verb = presenters.SIGNAL_BULK_LABEL if deliver else presenters.BULK_ACTIONS[action]
    known_origins = ("stranded", "failures", "signals")
    origin = source.get("origin") if source.get("origin") in known_origins else "list"
    # The count is of the rows that will be done: those the engine will refuse (wrong state,
    # no such step, no longer waiting) are counted apart, with why (the engine's preview).
    preview = None
    if preview_rows and ids and not error and not background:
        preview = operator_actions.preview_bulk(session(), ids, action, params)
    eligible_count = len(preview.eligible) if preview is not None else len(ids)
    to_type: str | None
    if preview_rows:
        # Over 100 of the rows it will change, the preview asks for that count to be typed.
        to_type = presenters.typed_confirmation(eligible_count, background=background)
    else:
        # The confirmation: the count the preview asked for travels with the form.
        expected = str(source.get("expected_count", "")).strip()
        to_type = "all" if background else (expected if expected.isdigit() else None)
    return {
        "action": action,
        "label": label,
        "verb": verb,
        "origin": origin,
        "back_url": _back_url(origin, filters),
        "danger": action in presenters.DESTRUCTIVE_ACTIONS,
        "confirm_label": (
            presenters.signal_confirm_label(params["name"], eligible_count)
            if deliver
            else presenters.bulk_confirm_label(
                action, eligible_count, target_step, background=background
            )
        ),
        "params": params,
        "field_errors": field_errors,
        "bulk_signal": _bulk_draft(source) if deliver else None,
        "preview": preview,
        "eligible_count": eligible_count,
        "refused_text": _refused_text(preview),
        "filters": filters,
        "ids": ids,
        "scope": source.get("scope", "selected"),
        "target_step": target_step,
        "error": error,
        "background": background,
        "to_type": to_type,
        "status": 400 if error else 200,
        "cap": dashboard_config()["BULK_CAP"],
        "in_dialog": is_htmx(),
    }


def _signal_params(source: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The inbox bulk deliver's engine parameters from its form, and what is wrong with the
    form per field (``name``, ``payload``): checked before any row is touched."""
    name = source.get("name", "").strip()
    key = source.get("idempotency_key", "").strip() or None
    params: dict[str, Any] = {
        "name": name,
        "idempotency_key": key,
        operator_actions.WAITING_ONLY: True,
    }
    errors: dict[str, str] = {}
    if not name:
        errors["name"] = "A signal needs a Name: the signal the selected workflows wait for."
    elif len(name) > MAX_NAME_LENGTH:
        errors["name"] = f"The Name is {len(name):,} characters long; at most {MAX_NAME_LENGTH}."
    try:
        params["payload"] = operator_actions.parse_payload(source.get("payload", ""))
        serialize_payload(params["payload"])
    except operator_actions.BAD_INPUT as exc:
        errors["payload"] = str(exc)
    return params, errors


def _bulk_draft(source: Any) -> dict[str, Any]:
    """What the operator typed into the inbox's bulk form, as typed (kept on every answer)."""
    ids = {i for i in (queries.parse_id(raw) for raw in source.getlist("ids")) if i is not None}
    return {
        "name": source.get("name", ""),
        "payload": source.get("payload", ""),
        "key": source.get("idempotency_key", ""),
        "ids": ids,
    }


def _refused_text(preview: operator_actions.BulkPreview | None) -> str:
    """ "3 will not be done: 3 ready (only a paused workflow can be resumed)." or "".

    Not "refused": the count includes workflows that no longer exist."""
    if preview is None or not preview.not_done:
        return ""
    return f"{preview.not_done:,} will not be done: {'; '.join(preview.reasons())}."


def _back_url(origin: str, filters: queries.WorkflowFilters) -> str:
    """Where "Back" and "Close" lead without script (with script they close the dialog)."""
    if origin == "stranded":
        return url_for("dashboard.stranded")
    if origin == "failures":
        return url_for("dashboard.failures")
    if origin == "signals":
        return url_for("dashboard.signals")
    params: dict[str, Any] = filters.as_params()
    return url_for("workflows.index", **params)


@bp.post("/signals/bulk")
def signal_bulk_preview() -> Any:
    """The inbox's bulk deliver, previewed: how many selected waiters still wait for that
    signal, and the confirm button (which posts to ``/workflows/bulk``).

    A POST that changes nothing, so the payload stays out of URLs and access logs. What the
    operator got wrong (no rows, a bad payload, a signal none of them waits for) comes back as
    the inbox's form, re-rendered in place with the reason next to its field and everything
    they typed still there.
    """
    context = _bulk_context(request.form)
    status = context.pop("status")
    errors = dict(context.get("field_errors") or {})
    preview = context.get("preview")
    if not context.get("error") and preview is not None and not preview.eligible:
        # Nothing would be delivered: say why next to the Name (a wrong name) or the selection.
        reasons = "; ".join(preview.reasons())
        count = len(context["ids"])
        text = (
            f"None of the {count:,} selected workflow{'' if count == 1 else 's'} is waiting "
            f"for `{context['params']['name']}`: {reasons}."
        )
        wrong_name = any(", not `" in reason for reason in preview.refused)
        errors["name" if wrong_name else "selection"] = text
        status = 409
    elif context.get("error") and not errors:
        errors["selection"] = context["error"]
    if errors:
        return _render_inbox_form(request.form, errors, status)
    response = render(
        "workflows/bulk.html", "workflows/_bulk_preview.html", status=status, **context
    )
    if is_htmx():
        # The form again, out of band and without errors: a previous try's error must not
        # linger next to a field that is now right (what was typed stays).
        form = _inbox_form_html(request.form, {}, oob=True)
        response.set_data(response.get_data(as_text=True) + form)
    return response


def _inbox_form_html(source: Any, errors: dict[str, str], *, oob: bool = False) -> str:
    """The inbox's bulk form as the operator filled it in, with ``errors`` by field."""
    from geneva_drive.dashboard.dashboard.views import signals_context

    return render_template(
        "dashboard/_inbox_bulk.html",
        bulk_draft={**_bulk_draft(source), "errors": errors},
        awaited=signals_context()["awaited"],
        form_oob=oob,
    )


def _render_inbox_form(source: Any, errors: dict[str, str], status: int) -> Any:
    """The inbox's bulk form with its errors: alone in place for HTMX (retargeted from the
    dialog), or the whole inbox without script."""
    from geneva_drive.dashboard.dashboard.views import signals_context

    draft = {**_bulk_draft(source), "errors": errors}
    if not is_htmx():
        return render(
            "dashboard/signals.html",
            "dashboard/_signals.html",
            status=status,
            bulk_draft=draft,
            **signals_context(),
        )
    response = make_response(_inbox_form_html(source, errors), status)
    response.headers["HX-Retarget"] = "#inbox-bulk"
    response.headers["HX-Reswap"] = "outerHTML"
    return response


@bp.get("/workflows/bulk")
def bulk_preview() -> Any:
    """How many workflows the action would touch, with a sample, and the confirm button.

    A GET: nothing changes until the confirmation form is posted.
    """
    context = _bulk_context(request.args)
    return render(
        "workflows/bulk.html",
        "workflows/_bulk_preview.html",
        status=context.pop("status"),
        **context,
    )


@bp.post("/workflows/bulk")
def bulk() -> Any:
    # The confirmation: the engine rechecks each row under its lock; no second preview.
    context = _bulk_context(request.form, preview_rows=False)
    status = context.pop("status")
    to_type = context.get("to_type")
    if (
        not context.get("error")
        and to_type
        and not presenters.typed_matches(request.form.get("typed_count", ""), to_type)
    ):
        # A big action needs its count typed (the page's script keeps the button disabled
        # until it is; this is the check for a post without it).
        context["error"] = f"Type {to_type} to confirm this action on that many workflows."
        status = 400
    if context.get("error"):
        return render(
            "workflows/bulk.html", "workflows/_bulk_preview.html", status=status, **context
        )
    params = context["params"]
    selection = {"filters": context["filters"].as_params(), "scope": context["scope"]}
    if context["background"]:
        batch_id = operator_actions.start_background_bulk(
            _actor(), context["action"], params, context["filters"], selection
        )
        if not is_htmx():
            return redirect(url_for("workflows.bulk_progress", batch_id=batch_id))
        return _render_progress(batch_id)
    result = operator_actions.perform_bulk(
        _actor(), context["ids"], context["action"], params, selection
    )
    message = f"{context['label']}: {result.summary}"
    if not is_htmx():
        flash(message)
        for line in result.messages:
            flash(line)
        return redirect(context["back_url"])
    # The region behind the dialog is re-rendered out of band: the stranded groups, or the
    # list (without its selection, which the action has used up).
    behind: dict[str, Any]
    if context["origin"] == "stranded":
        behind = {"groups": queries.stranded_groups(session())}
    elif context["origin"] == "signals":
        from geneva_drive.dashboard.dashboard.views import signals_context

        db.session.expire_all()
        behind = signals_context()
    elif context["origin"] == "failures":
        behind = {}  # past failures stay what they were; the dialog shows the outcome
    else:
        behind = list_context(context["filters"])
    response = render(
        "workflows/bulk.html",
        "workflows/_bulk_result.html",
        result=result,
        message=message,
        action=context["action"],
        label=context["label"],
        origin=context["origin"],
        back_url=context["back_url"],
        in_dialog=True,
        **behind,
    )
    return with_trigger(response, "geneva:toast", {"message": message, "ok": not result.refused})


def _render_progress(batch_id: int) -> Any:
    batch = db.session.get(OperatorAction, batch_id)
    if batch is None or not batch.action.startswith("bulk_"):
        abort(404, description=f"There is no bulk action #{batch_id}.")
    view = presenters.action_view(batch)
    running = batch.result == "running"
    status = 200 if running or not is_htmx() else STOP_POLLING
    return render(
        "workflows/bulk.html",
        "workflows/_bulk_progress.html",
        status=status,
        batch=view,
        done=int((batch.params or {}).get("done", 0)),
        refused=int((batch.params or {}).get("refused", 0)),
        running=running,
    )


@bp.get("/workflows/bulk/<int:batch_id>")
def bulk_progress(batch_id: int) -> Any:
    """Progress of a bulk action running in the background (polls until it is over)."""
    return _render_progress(batch_id)
