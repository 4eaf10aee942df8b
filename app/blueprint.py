"""The dashboard as one Blueprint, ``geneva_drive``, for the standalone app and for hosts alike.

Its hooks run for every page of the dashboard and for nothing else of a host's: CSRF, then who
is asking (auth), then input checks; security headers and ``Vary: HX-Request`` on the way out;
the dashboard's own error pages for errors raised in its views. Flask lets hooks be added to a
blueprint only before its first registration, so they are added here, once, at import.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from geneva_drive.dashboard import auth, csrf, errors, htmx, metrics, package_data, security, urls
from geneva_drive.dashboard.dashboard import bp as dashboard_bp
from geneva_drive.dashboard.workflows import bp as workflows_bp

STATIC = package_data.locate("static")

bp = Blueprint(urls.BLUEPRINT, __name__, static_folder=str(STATIC), static_url_path="/static")

# Order matters: CSRF refuses forged requests before auth looks at who sent them.
bp.before_request(csrf.check)
bp.before_request(auth.authorize)
bp.before_request(security.refuse_nul)
bp.after_request(security.add_headers)
bp.after_request(htmx.vary_on_hx_request)
errors.register(bp)


@bp.context_processor
def _dashboard_context() -> dict[str, Any]:
    return {
        "current_user": auth.current_user(),
        "current_endpoint": urls.current_endpoint(),
        "own_login": auth.uses_own_login(),
    }


bp.register_blueprint(auth.bp)
bp.register_blueprint(dashboard_bp)
bp.register_blueprint(workflows_bp)
bp.register_blueprint(metrics.bp)
