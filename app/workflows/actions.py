"""Operator actions (POST only; CSRF and the operator role are checked before any view runs).

HTMX requests get the re-rendered live region plus an ``HX-Trigger`` toast; plain form posts
get POST/redirect/GET on success, and the page re-rendered with the refusal inline (409/400)
when the engine says no, so the message sits next to the control either way.
"""

from __future__ import annotations

from typing import Any

from flask import abort, flash, redirect, request

from geneva_drive.dashboard import operator_actions, presenters, queries
from geneva_drive.dashboard.auth import current_user
from geneva_drive.dashboard.extensions import db, session
from geneva_drive.dashboard.htmx import STOP_POLLING, is_htmx, render, with_trigger
from geneva_drive.dashboard.state import dashboard_config
from geneva_drive.dashboard.urls import url_for
from geneva_drive.dashboard.workflows import bp
from geneva_drive.dashboard.workflows.views import list_context, load_workflow, render_detail
from geneva_drive.models import OperatorAction
from geneva_drive.states import Operation

SIMPLE_ACTIONS = tuple(op for op in Operation if op != Operation.SIGNAL)


def _actor() -> str:
    user = current_user()
    assert user is not None  # auth.authorize() refused anonymous POSTs already
    return user.name


def _respond(workflow_id: int, result: operator_actions.ActionResult) -> Any:
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
    params = {"name": form.get("name", "").strip(), "idempotency_key": key}
    raw_payload = form.get("payload", "")
    result = operator_actions.perform(
        _actor(),
        workflow_id,
        "signal",
        params,
        prepare=lambda: {"payload": operator_actions.parse_payload(raw_payload)},
    )
    back = form.get("back")
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
            **signals_context(),
        )
        return with_trigger(response, "geneva:toast", {"message": message, "ok": result.ok})
    return _respond(workflow_id, result)


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


def _bulk_context(source: Any) -> dict[str, Any]:
    action = source.get("action", "")
    if action not in presenters.BULK_ACTIONS:
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
    label, verb = presenters.BULK_ACTIONS[action]
    origin = source.get("origin") if source.get("origin") in ("stranded", "failures") else "list"
    return {
        "action": action,
        "label": label,
        "verb": verb,
        "origin": origin,
        "back_url": _back_url(origin, filters),
        "danger": action in presenters.DESTRUCTIVE_ACTIONS,
        "confirm_label": presenters.bulk_confirm_label(
            action, len(ids), target_step, background=background
        ),
        "filters": filters,
        "ids": ids,
        "scope": source.get("scope", "selected"),
        "target_step": target_step,
        "error": error,
        "background": background,
        "status": 400 if error else 200,
        "cap": dashboard_config()["BULK_CAP"],
        "in_dialog": is_htmx(),
    }


def _back_url(origin: str, filters: queries.WorkflowFilters) -> str:
    """Where "Back" and "Close" lead without script (with script they close the dialog)."""
    if origin == "stranded":
        return url_for("dashboard.stranded")
    if origin == "failures":
        return url_for("dashboard.failures")
    params: dict[str, Any] = filters.as_params()
    return url_for("workflows.index", **params)


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
    context = _bulk_context(request.form)
    status = context.pop("status")
    if context.get("error"):
        return render(
            "workflows/bulk.html", "workflows/_bulk_preview.html", status=status, **context
        )
    params = {"step": context["target_step"]} if context["action"] == "resume_at" else {}
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
