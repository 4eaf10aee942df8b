"""CSRF protection: a per-session token on every unsafe request, plus a Fetch-Metadata check.

The token lives in the signed session cookie and travels back in the ``X-CSRF-Token`` header
(``hx-headers`` on ``<body>``, for HTMX) or the ``csrf_token`` form field (plain forms, which
keep working without JavaScript). Browsers that send ``Sec-Fetch-Site`` also have cross-site
requests refused outright, as Sidekiq 8.1 does, in case a token ever leaks; where that header is
absent (older browsers, some privacy modes), an ``Origin`` header naming another origin than
the request's own is refused the same way (OWASP's "verifying origin with standard headers").
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from flask import abort, g, request, session

#: Namespaced: mounted in a host app, the dashboard shares the host's session.
SESSION_KEY = "geneva_drive.csrf"
HEADER = "X-CSRF-Token"
FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_token() -> str:
    """The session's token, created on first use (templates call this)."""
    token = session.get(SESSION_KEY)
    if not token:
        token = secrets.token_urlsafe(32)
        session[SESSION_KEY] = token
    return str(token)


def check() -> None:
    """Refuse an unsafe request without a valid token: 400 when missing, 403 when wrong."""
    if request.method in SAFE_METHODS:
        return
    g.geneva_refusal = "csrf"  # any abort below is a CSRF refusal (audited as such)
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        abort(403, description="Cross-site request refused.")
    if site is None and not _same_origin(request.headers.get("Origin")):
        abort(403, description="Cross-origin request refused.")
    sent = request.headers.get(HEADER) or request.form.get(FIELD)
    if not sent:
        abort(400, description="The CSRF token is missing. Reload the page and try again.")
    expected = session.get(SESSION_KEY)
    if not expected or not hmac.compare_digest(str(sent), str(expected)):
        abort(403, description="The CSRF token is invalid. Reload the page and try again.")
    g.pop("geneva_refusal", None)


def _same_origin(origin: str | None) -> bool:
    """Whether an ``Origin`` header names this request's own origin (absent counts as same:
    some browsers omit it on same-origin form posts, and the token is still required)."""
    if origin is None:
        return True
    parts = urlsplit(origin)
    if origin == "null" or not parts.scheme or not parts.netloc:
        return False  # opaque origins (sandboxed frames, file: pages) are never ours
    # The host, not the scheme: behind a TLS proxy without ProxyFix the request looks like http
    # while the browser says https; a page on another host is what CSRF is about.
    return parts.netloc.lower() == request.host.lower()
