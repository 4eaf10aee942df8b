"""Security headers on every response.

The CSP allows no inline script or style: htmx is configured through a ``<meta>`` tag with
``includeIndicatorStyles`` off (htmx would otherwise inject a ``<style>`` element), and our
own behaviour lives in ``static/js/app.js``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask import Flask, Response, abort, current_app, g, request
from flask.sessions import SecureCookieSessionInterface
from werkzeug.routing import IntegerConverter

from geneva_drive.dashboard import urls
from geneva_drive.logsafe import escape

log = logging.getLogger(__name__)

#: Refused requests recorded in the audit log per app and minute, at most: the rest are
#: counted and summed up in the next row (and logged), so refusals cannot flood the table.
REFUSALS_AUDITED_PER_MINUTE = 30
#: The audit log's ``action`` of a refused request; its ``result`` says why (see below).
REFUSED_REQUEST = "refused_request"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


def refuse_nul() -> None:
    """No dashboard input may hold a NUL character: PostgreSQL refuses it in any text value,
    so it would surface as a database error. Refused up front with a 400 instead."""
    values = [request.path, *request.args.values()]
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        values.extend(request.form.values())
    if any("\x00" in value for value in values):
        abort(400, description="The request contains a NUL character.")


class SessionInterface(SecureCookieSessionInterface):
    """The signed-cookie session, marked ``Secure`` whenever the request came over HTTPS, even
    when ``SESSION_COOKIE_SECURE`` was left off (set it to force the flag everywhere)."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or bool(request and request.is_secure)


def add_headers(response: Response) -> Response:
    """The dashboard's security headers (on its own responses; a host's pages keep theirs)."""
    headers = response.headers
    headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("X-Frame-Options", "DENY")
    headers.setdefault("Referrer-Policy", "same-origin")
    if g.get("user") is not None and urls.current_endpoint() != "static":
        # Pages for a signed-in user hold workflow data: no browser or proxy cache may keep
        # them (the back button after logout, a shared machine, a caching proxy).
        headers["Cache-Control"] = "no-store"
        response.vary.add("Cookie")
    return response


def init_app(app: Flask) -> None:
    """The standalone app's own session cookie (a host keeps its session interface)."""
    app.session_interface = SessionInterface()
    app.after_request(add_headers)


class BoundedIntConverter(IntegerConverter):
    """``<int:…>`` limited to the BIGINT range (ids); a larger number does not match (404)."""

    def __init__(self, map: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max", 2**63 - 1)
        super().__init__(map, *args, **kwargs)


# --- refused requests in the audit log -----------------------------------------------------------


class RefusalBudget:
    """How many refusals this app may still record in the current minute (thread-safe)."""

    def __init__(self, per_minute: int = REFUSALS_AUDITED_PER_MINUTE) -> None:
        self.per_minute = per_minute
        self._lock = threading.Lock()
        self._window = 0.0
        self._used = 0
        self.skipped = 0

    def take(self) -> int | None:
        """None when over budget (the refusal is counted); else how many were skipped since
        the last recorded one (and the count starts again)."""
        now = time.monotonic()
        with self._lock:
            if now - self._window >= 60.0:
                self._window, self._used = now, 0
            if self._used >= self.per_minute:
                self.skipped += 1
                return None
            self._used += 1
            skipped, self.skipped = self.skipped, 0
            return skipped


def _refusal_kind(status: int) -> str | None:
    kind: str | None = g.get("geneva_refusal")
    if status == 403:
        return kind or "forbidden"
    if status == 400 and kind:
        return kind
    args = request.view_args or {}
    if status == 404 and ("workflow_id" in args or "batch_id" in args):
        return "not_found"  # an id that does not exist: probing, or a stale page
    return None


def note_refused_actor(actor: str) -> None:
    """Who a refusal of this request is recorded under when no dashboard user was made: a host
    user refused by role is known (``host:<id> <name>``, the form of their allowed actions)."""
    g.geneva_refused_actor = actor


def _refusing_actor() -> str:
    from geneva_drive.dashboard import auth

    user = g.get("user")
    noted: str | None = g.get("geneva_refused_actor")
    if user is None and noted is not None:  # a host user refused by role
        return noted
    if user is None:  # refused before auth ran (CSRF): who the session says, if anyone
        try:
            user = auth._load_user()
        except Exception:
            user = None
    return str(user.actor) if user is not None else f"anonymous {request.remote_addr or '?'}"


def audit_refusal(status: int, description: str) -> None:
    """Record a refused request (a viewer's 403, a CSRF refusal, an unknown id) in the audit
    log, within the app's :class:`RefusalBudget`. Never raises: the refusal is answered
    whatever happens here."""
    kind = _refusal_kind(status)
    if kind is None:
        return
    budget: RefusalBudget = current_app.extensions.setdefault(
        "geneva_drive.refusal_budget", RefusalBudget()
    )
    skipped = budget.take()
    if skipped is None:
        return
    from geneva_drive.dashboard.extensions import db
    from geneva_drive.operator_actions import record

    try:
        actor = _refusing_actor()
        args = request.view_args or {}
        workflow_id = args.get("workflow_id")
        message = description
        if skipped:
            message += f" ({skipped} more refusals in the last minute were not recorded)"
        params: dict[str, Any] = {"method": request.method, "path": request.path[:300]}
        if isinstance(workflow_id, int):
            # In the parameters, not the row's workflow_id: a refusal is not part of the
            # workflow's history (its page lists what was done to it), and the id may not exist.
            params["workflow_id"] = workflow_id
        db.session.rollback()
        record(
            db.session(),
            actor[:255],
            REFUSED_REQUEST,
            None,
            {**params, "status": status},
            None,
            None,
            kind,
            message,
        )
        db.session.commit()
        log.warning(
            "Refused %s %s (%s, %s) for %s",
            request.method,
            escape(request.path, 300),
            status,
            kind,
            escape(actor, 300),
        )
    except Exception:
        log.exception("Could not record a refused request in the audit log")
        try:
            db.session.rollback()
        except Exception:
            pass
