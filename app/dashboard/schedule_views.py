"""The Schedules page (``/schedules``) and its actions: Pause, Resume and Run now, each a POST
under the schedule it changes (CSRF and the operator role are checked before any view runs).

HTMX requests get the re-rendered list plus an ``HX-Trigger`` toast; plain form posts get
POST/redirect/GET on success, and the page re-rendered with the refusal next to the
schedule's buttons (409) when the engine says no - like the workflow actions.
"""

from __future__ import annotations

from typing import Any

from flask import abort, flash, redirect

from geneva_drive.dashboard import schedules as schedule_list
from geneva_drive.dashboard.auth import current_user
from geneva_drive.dashboard.dashboard import bp
from geneva_drive.dashboard.extensions import db, session
from geneva_drive.dashboard.htmx import is_htmx, render, with_trigger
from geneva_drive.dashboard.urls import url_for
from geneva_drive.operator_actions import ScheduleActionResult, perform_schedule

#: The action routes: the URL's last part and the engine's action (its audit name).
ROUTES = {
    "pause": "schedule_pause",
    "resume": "schedule_resume",
    "run-now": "schedule_run_now",
}


def render_schedules(status: int = 200, outcome: dict[str, Any] | None = None) -> Any:
    """The page, or its list for HTMX; ``outcome`` (``name``, ``message``, ``ok``) is shown
    next to that schedule's buttons."""
    user = current_user()
    view = schedule_list.schedules_view(session(), can_act=user is not None and user.can_act)
    return render(
        "dashboard/schedules.html",
        "dashboard/_schedules.html",
        status=status,
        view=view,
        outcome=outcome,
        limit=schedule_list.LIMIT,
    )


@bp.get("/schedules")
def schedules() -> Any:
    """Every schedule: cadence in words, next fire times, last run, skipped and missed ticks."""
    return render_schedules()


def _respond(name: str, result: ScheduleActionResult) -> Any:
    if result.gone:
        abort(404, description=result.message)
    if not is_htmx() and result.ok:
        flash(result.message)
        return redirect(url_for("dashboard.schedules"))
    db.session.expire_all()
    outcome = {"name": name, "message": result.message, "ok": result.ok}
    response = render_schedules(status=result.status, outcome=outcome)
    return with_trigger(response, "geneva:toast", {"message": result.message, "ok": result.ok})


def _action_view(action: str) -> Any:
    def view(name: str) -> Any:
        user = current_user()
        assert user is not None  # auth.authorize() refused anonymous POSTs already
        return _respond(name, perform_schedule(db.session(), user.actor, name, action))

    view.__name__ = action
    return view


for _path, _action in ROUTES.items():
    # <path:name>: a schedule's name may hold "/" ("report/weekly"); the action is the last part.
    bp.add_url_rule(
        f"/schedules/<path:name>/{_path}",
        endpoint=_action,
        view_func=_action_view(_action),
        methods=["POST"],
    )
