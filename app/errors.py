"""HTTP mapping of errors, in one place.

Engine refusals are the operator's business, not a crash: they become 409 with the engine's
own message; malformed input (bad JSON, an unknown step name type) becomes 400. Nothing here
ever turns an engine refusal into a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask, request
from flask.globals import request_ctx
from markupsafe import escape
from werkzeug.exceptions import HTTPException, SecurityError

from geneva_drive.dashboard import security
from geneva_drive.dashboard.extensions import db
from geneva_drive.dashboard.htmx import is_htmx
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.errors import EngineError
from geneva_drive.logsafe import escape as log_escape

# The refusal kinds and their status live with the operator actions in the engine, where the
# CLI uses them too.
from geneva_drive.operator_actions import BAD_INPUT, CONFLICTS, REFUSALS, status_for

log = logging.getLogger(__name__)

__all__ = ["BAD_INPUT", "CONFLICTS", "REFUSALS", "status_for"]


def minimal_page(status: int, title: str, message: str) -> str:
    """An error page built without templates, static files or the database: what is shown
    when the error page itself cannot be rendered (an error page must never depend on the
    thing that failed; a missing template once made every page an empty reply)."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{status} {escape(title)} · GenevaDrive</title></head>"
        f"<body><h1>{status} {escape(title)}</h1><p>{escape(message)}</p></body></html>"
    )


def _render_error(status: int, title: str, message: str) -> Any:
    if is_htmx():
        # The toast script shows this text; a whole page would be swapped into a fragment.
        return message, status, {"Content-Type": "text/plain; charset=utf-8"}
    if request_ctx.url_adapter is None:
        # Refused before routing (an untrusted Host): the templates' url_for cannot work.
        return minimal_page(status, title, message), status
    try:
        page = render_template("error.html", status=status, title=title, message=message)
    except Exception:
        log.exception("The error page could not be rendered; answering %s without it", status)
        page = minimal_page(status, title, message)
    return page, status


def register(target: Flask | Blueprint) -> None:
    """The dashboard's error pages: on its Blueprint, and on the standalone app (for a URL that
    matches no route, which no blueprint sees)."""

    @target.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Any:
        if isinstance(error, SecurityError):
            # A Host outside GENEVA_TRUSTED_HOSTS: anyone can send these by the thousand, so
            # one line each and the page that needs nothing (no template, no url_for).
            log.warning(
                "Refused %s %s for the untrusted Host %s from %s",
                request.method,
                log_escape(request.path, 300),
                log_escape(request.environ.get("HTTP_HOST", ""), 300),
                log_escape(request.remote_addr or "?", 60),
            )
            return minimal_page(400, "Bad Request", "This host name is not served here."), 400
        if isinstance(target, Blueprint):  # the dashboard's own pages (a host's are its own)
            security.audit_refusal(error.code or 500, error.description or error.name)
        return _render_error(
            error.code or 500, error.name, error.description or "Something went wrong."
        )

    @target.errorhandler(UnicodeDecodeError)
    def _undecodable(error: UnicodeDecodeError) -> Any:
        # Raw non-UTF-8 bytes in the query string or form (werkzeug decodes them strictly).
        return _render_error(400, "Bad Request", "The request is not valid UTF-8.")

    @target.errorhandler(EngineError)
    def _engine_error(error: EngineError) -> Any:
        # Views route actions through app.operator, which catches refusals itself; this is
        # the safety net for a refusal raised anywhere else.
        db.session.rollback()
        return _render_error(status_for(error), "Refused", str(error))
