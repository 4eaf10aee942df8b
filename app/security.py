"""Security headers on every response.

The CSP allows no inline script or style: htmx is configured through a ``<meta>`` tag with
``includeIndicatorStyles`` off (htmx would otherwise inject a ``<style>`` element), and our
own behaviour lives in ``static/js/app.js``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, abort, g, request
from flask.sessions import SecureCookieSessionInterface
from werkzeug.routing import IntegerConverter

from geneva_drive.dashboard import urls

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
