"""HTTP mapping of errors, in one place (STYLE §3.8).

Engine refusals are the operator's business, not a crash: they become 409 with the engine's
own message; malformed input (bad JSON, an unknown step name type) becomes 400. Nothing here
ever turns an engine refusal into a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask
from werkzeug.exceptions import HTTPException

from geneva_drive.dashboard.extensions import db
from geneva_drive.dashboard.htmx import is_htmx
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.errors import (
    CursorTooLargeError,
    DuplicateWorkflowError,
    EngineError,
    InvalidStateError,
    InvalidStateTransition,
    SignalPayloadTooLargeError,
    StepNotDefinedError,
    WorkflowNotOngoing,
)

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
    """409 for engine refusals, 400 for malformed input."""
    if isinstance(error, BAD_INPUT):
        return 400
    return 409


def _render_error(status: int, title: str, message: str) -> Any:
    if is_htmx():
        # The toast script shows this text; a whole page would be swapped into a fragment.
        return message, status, {"Content-Type": "text/plain; charset=utf-8"}
    return render_template("error.html", status=status, title=title, message=message), status


def register(target: Flask | Blueprint) -> None:
    """The dashboard's error pages: on its Blueprint, and on the standalone app (for a URL that
    matches no route, which no blueprint sees)."""

    @target.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> Any:
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
