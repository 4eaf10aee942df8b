"""Read-only workflow views: the filtered list, one workflow, every workflow of one hero."""

from __future__ import annotations

from typing import Any

from flask import abort, redirect, request

from geneva_drive.dashboard import presenters, queries
from geneva_drive.dashboard import schedules as schedule_list
from geneva_drive.dashboard.auth import current_user
from geneva_drive.dashboard.config import trace_url
from geneva_drive.dashboard.extensions import db, session
from geneva_drive.dashboard.htmx import STOP_POLLING, is_htmx, render
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.dashboard.state import dashboard_config
from geneva_drive.dashboard.urls import url_for
from geneva_drive.dashboard.workflows import bp
from geneva_drive.states import WorkflowState
from geneva_drive.workflow import Workflow, workflow_class


def list_context(filters: queries.WorkflowFilters) -> dict[str, Any]:
    """Everything the list page and its partial show, for ``filters`` and the page cursor."""
    after, before = request.args.get("after"), request.args.get("before")
    # The overdue list is sorted by lateness, not id: no pin (a row becoming overdue is the
    # least late and lands at the bottom, below what is being read).
    first_page = not after and not before and filters.due != "overdue"
    upto = queries.parse_id(request.args.get("upto")) if first_page else None
    page = queries.workflow_page(session(), filters, after, before, upto=upto)
    if first_page and upto is None and page.items:
        upto = int(page.items[0].id)
    cls = workflow_class(filters.cls) if filters.cls else None
    user = current_user()
    return {
        "filters": filters,
        "page": page,
        "rows": presenters.workflow_rows(session(), page.items),
        "classes": sorted(queries.definitions()),
        "states": [s.value for s in WorkflowState],
        "due_filters": queries.DUE_FILTERS,
        "bulk_actions": presenters.BULK_ACTIONS if user is not None and user.can_act else {},
        "dangerous_bulk_actions": presenters.DANGEROUS_BULK_ACTIONS,
        "bulk_steps": [s.name for s in cls.steps.runnable] if cls is not None else [],
        "bulk_cap": dashboard_config()["BULK_CAP"],
        # The poll keeps the first page pinned at the rows shown; newer ones are announced.
        "upto": upto,
        "newer": queries.newer_count(session(), filters, upto) if upto is not None else 0,
        "newer_cap": queries.NEWER_CAP,
    }


@bp.get("/workflows")
def index() -> Any:
    filters = queries.WorkflowFilters.from_args(request.args)
    return render("workflows/index.html", "workflows/_results.html", **list_context(filters))


def load_workflow(workflow_id: int) -> Workflow:
    workflow = db.session.get(Workflow, workflow_id)
    if workflow is None:
        abort(404, description=f"Workflow #{workflow_id} does not exist.")
    return workflow


def render_detail(
    workflow: Workflow,
    *,
    status: int = 200,
    refusal: str | None = None,
    notice: str | None = None,
    signal_draft: dict[str, Any] | None = None,
    before: int | None = None,
) -> Any:
    """The detail page, or its live region for HTMX (polls, actions).

    ``before``: the timeline shows the page of executions before that one (the "Older"
    link without JavaScript); the newest page otherwise.

    A terminal workflow's live region is answered with 286, which tells htmx to stop polling
    (the region is also rendered without its poll trigger, so a swap cannot restart it).
    """
    detail = presenters.workflow_detail(session(), workflow, current_user(), before)
    detail.refusal = refusal
    detail.notice = notice
    # Created by a schedule: its name and tick (metadata), linked to /schedules.
    detail.extra["schedule"] = schedule_list.origin(session(), workflow)
    # Traced (docs/MANUAL.md, "Tracing") and GENEVA_TRACE_URL_TEMPLATE set: a link to the trace.
    detail.extra["trace_url"] = trace_url(
        dashboard_config().get("TRACE_URL_TEMPLATE"), workflow.metadata_
    )
    if signal_draft is not None:
        # A refused signal: its form reopens with what was typed and the reason beside it.
        detail.extra["signal_draft"] = signal_draft
    if is_htmx() and status == 200 and not detail.live:
        status = STOP_POLLING
    return render("workflows/detail.html", "workflows/_live.html", status=status, detail=detail)


@bp.get("/workflows/<int:workflow_id>")
def detail(workflow_id: int) -> Any:
    return render_detail(load_workflow(workflow_id), before=request.args.get("before", type=int))


@bp.get("/workflows/<int:workflow_id>/timeline")
def timeline(workflow_id: int) -> Any:
    """The timeline's next older page, as the list items the "Older" link is replaced with
    (HTMX); without HTMX, the detail page showing that page."""
    before = request.args.get("before", type=int)
    workflow = load_workflow(workflow_id)
    if not is_htmx():
        return redirect(url_for("workflows.detail", workflow_id=workflow_id, before=before))
    detail = presenters.workflow_detail(session(), workflow, current_user(), before)
    return render_template("workflows/_timeline_items.html", detail=detail)


# path: a hero id may hold "/" (order numbers like "eu/2026/0042"); the type is a class name.
@bp.get("/heroes/<hero_type>/<path:hero_id>")
def hero(hero_type: str, hero_id: str) -> Any:
    workflows = queries.hero_workflows(session(), hero_type, hero_id)
    return render(
        "workflows/hero.html",
        "workflows/_hero.html",
        hero_type=hero_type,
        hero_id=hero_id,
        rows=presenters.workflow_rows(session(), workflows),
        limit=queries.HERO_LIMIT,
    )
