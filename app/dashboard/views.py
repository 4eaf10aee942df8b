"""Views of the cross-workflow pages. Each parses input, asks a query, builds presenters and
renders the page, or only its partial for HTMX."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import abort, request
from sqlalchemy import text

from geneva_drive import health
from geneva_drive.config import settings
from geneva_drive.dashboard import charts, limits_page, presenters, queries
from geneva_drive.dashboard import workers as worker_list
from geneva_drive.dashboard.dashboard import bp
from geneva_drive.dashboard.extensions import session
from geneva_drive.dashboard.htmx import render
from geneva_drive.states import WorkflowState


@bp.get("/healthz")
def healthz() -> dict[str, Any]:
    """Liveness and a database round trip (JSON), public like ``/metrics``: at ``/healthz`` in
    the standalone dashboard and at ``<GENEVA_URL_PREFIX>/healthz`` in a host application."""
    session().execute(text("SELECT 1"))
    return {"status": "ok", "database": "ok"}


@bp.get("/")
def overview() -> Any:
    window = request.args.get("window", "1h")
    if window not in queries.FAILURE_WINDOWS:
        window = "1h"
    with queries.snapshot_beside(session()) as snapshot:
        trends = charts.trends(session())
        data = queries.overview(session(), window, snapshot)
        held = queries.cached("overview:limits", lambda: limits_page.deferring_most(session()))
    return render(
        "dashboard/overview.html",
        "dashboard/_overview.html",
        data=data,
        classes=sorted(data.counts),
        states=[s.value for s in WorkflowState],
        settings=settings,
        windows=list(queries.FAILURE_WINDOWS),
        trends=trends,
        held=held,
    )


def signals_context() -> dict[str, Any]:
    """What the signal inbox shows (the page, its poll, and the answer to a send from it)."""
    parked = queries.parked_executions(session())
    groups = presenters.waiter_groups(parked)
    return {
        "groups": groups,
        "awaited": presenters.awaited_names(groups),
        "truncated": len(parked) >= queries.INBOX_LIMIT,
        "pending": [presenters.signal_view(s) for s in queries.pending_signals(session())],
        "recent": [presenters.signal_view(s) for s in queries.recent_signals(session())],
        "timed_out": presenters.timed_out_waits(session()),
        "limit": queries.INBOX_LIMIT,
    }


@bp.get("/signals")
def signals() -> Any:
    return render("dashboard/signals.html", "dashboard/_signals.html", **signals_context())


@bp.get("/definitions")
def definitions() -> Any:
    classes = [presenters.class_definition(session(), c) for c in queries.definitions().values()]
    return render(
        "dashboard/definitions.html", "dashboard/_definitions.html", classes=classes, single=False
    )


@bp.get("/definitions/<name>")
def definition(name: str) -> Any:
    cls = queries.definitions().get(name)
    if cls is None:
        abort(404, description=f"No workflow class named {name!r} is registered.")
    classes = [presenters.class_definition(session(), cls)]
    return render(
        "dashboard/definitions.html",
        "dashboard/_definitions.html",
        classes=classes,
        single=True,
        durations=charts.durations(session(), name, timedelta(days=1)),
    )


@bp.get("/stranded")
def stranded() -> Any:
    return render(
        "dashboard/stranded.html",
        "dashboard/_stranded.html",
        groups=queries.stranded_groups(session()),
    )


@bp.get("/unexplained")
def unexplained() -> Any:
    """Ongoing workflows that fit no explanation (``geneva-drive doctor``'s list, bounded)."""
    return render(
        "dashboard/unexplained.html",
        "dashboard/_unexplained.html",
        findings=health.unexplained(session()),
        limit=health.DEFAULT_LIMIT,
        grace=health.GRACE,
    )


@bp.get("/failures")
def failures() -> Any:
    window = request.args.get("window", "24h")
    if window not in queries.FAILURE_WINDOWS:
        window = "24h"
    groups = queries.failure_groups(session(), queries.FAILURE_WINDOWS[window])
    return render(
        "dashboard/failures.html",
        "dashboard/_failures.html",
        groups=groups,
        window=window,
        windows=list(queries.FAILURE_WINDOWS),
        step_not_defined=queries.STEP_NOT_DEFINED,
    )


@bp.get("/limits")
def limits() -> Any:
    """Concurrency and rate limits (docs/MANUAL.md, "Concurrency and rate limits"): in use, waiting and deferred, the keys with
    the most of each, how long the oldest waits and an estimate of the time to drain."""
    return render(
        "dashboard/limits.html",
        "dashboard/_limits.html",
        limits=limits_page.backlog(session(), top=queries.LIMIT_TOP_KEYS),
        settings=settings,
        pace_window=limits_page.PACE_WINDOW,
        row_cap=limits_page.ROW_CAP,
    )


@bp.get("/workers")
def workers() -> Any:
    """Live workers, and those stopped or expired in the last day, with their running steps."""
    return render(
        "dashboard/workers.html",
        "dashboard/_workers.html",
        view=worker_list.workers_view(session()),
        lease=worker_list.seconds_text(settings.worker_lease),
        interval=worker_list.seconds_text(settings.worker_heartbeat_interval),
        recovery_action=settings.stuck_recovery_action,
        limit=worker_list.LIMIT,
    )


@bp.get("/audit")
def audit() -> Any:
    filters = queries.AuditFilters.from_args(request.args)
    page = queries.audit_page(
        session(), filters, request.args.get("after"), request.args.get("before")
    )
    return render(
        "dashboard/audit.html",
        "dashboard/_audit.html",
        page=page,
        rows=[presenters.action_view(a) for a in page.items],
        filters=filters,
    )
