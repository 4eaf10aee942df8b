"""HTMX helpers: one template per page, its partial rendered alone for HTMX requests.

A full page *includes* its partial, so there is one source of markup. Every GET
answer varies on ``HX-Request`` so caches never hand a fragment to a full-page load.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Response, make_response, request

from geneva_drive.dashboard.rendering import render_template

#: htmx stops polling an element whose request is answered with this status.
STOP_POLLING = 286


def is_htmx() -> bool:
    """True for an HTMX request, except a history restore (which needs the whole page)."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.history_restore_request


def render(page: str, partial: str, /, status: int = 200, **context: Any) -> Response:
    """Render ``page`` for a normal request and only ``partial`` for an HTMX request."""
    template = partial if is_htmx() else page
    response = make_response(render_template(template, **context), status)
    return response


def with_trigger(response: Response, event: str, detail: Any) -> Response:
    """Add an ``HX-Trigger`` event (the toast) to ``response``, dispatched on ``<body>``.

    Not on the element that made the request: the swap may replace it, and an event on a
    detached element never reaches the listeners.
    """
    response.headers["HX-Trigger"] = json.dumps({event: {**detail, "target": "body"}})
    return response


def vary_on_hx_request(response: Response) -> Response:
    response.vary.add("HX-Request")
    return response
