"""Who is looking, and may they act: users from configuration, roles, demo mode, host hook.

Roles: ``viewer`` (read-only) and ``operator`` (may run actions). The server enforces them:
every unsafe request from a viewer is answered 403, whatever the page showed.

Three ways in, tried in order on each request:

1. **The host application's login.** Set ``USER_LOADER`` (``GENEVA_USER_LOADER``) to a
   callable, or a ``"module:attribute"`` string, taking the Flask request and returning a
   :class:`DashboardUser` or ``None``. Use it when the dashboard is mounted inside an app that
   already knows who is signed in::

       def dashboard_user(request):
           user = my_app.current_user(request)
           if user is None:
               return None
           return DashboardUser(user.email, "operator" if user.is_admin else "viewer")

       create_app({"USER_LOADER": dashboard_user})

2. **The built-in login** (``/login``) against ``USERS``: ``{name: {"password_hash": ...,
   "role": ...}}`` with hashes from ``werkzeug.security.generate_password_hash``. The role is
   read from configuration on every request, so removing a user takes effect at once.

3. **Demo mode** (``DEMO``): clients on the loopback interface are the operator ``demo``
   without a login. Anyone reaching the app from another address still has to log in, so a
   demo started on ``0.0.0.0`` by mistake does not hand out operator rights to the network.
"""

from __future__ import annotations

import importlib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    Response,
    abort,
    g,
    redirect,
    request,
    session,
)
from werkzeug.security import check_password_hash

from geneva_drive.dashboard import csrf
from geneva_drive.dashboard.ratelimit import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_WINDOW_SECONDS,
)
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.dashboard.state import dashboard_config, state
from geneva_drive.dashboard.urls import current_endpoint, url_for

ROLES = ("viewer", "operator")
DEMO_USER = "demo"
#: The signed-in user's name in the session. Namespaced like every key the dashboard keeps
#: there: mounted in a host app, the session (and its cookie) is the host's.
USER_KEY = "geneva_drive.user"
SESSION_PREFIX = "geneva_drive."

bp = Blueprint("auth", __name__)


@dataclass(frozen=True)
class DashboardUser:
    """The person behind a request: a display name and a role."""

    name: str
    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Unknown dashboard role {self.role!r}; use one of {', '.join(ROLES)}")

    @property
    def can_act(self) -> bool:
        return self.role == "operator"


def current_user() -> DashboardUser | None:
    user: DashboardUser | None = g.get("user")
    return user


def _resolve_loader(value: Any) -> Callable[[Any], DashboardUser | None] | None:
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    module_name, _, attribute = str(value).partition(":")
    loader = getattr(importlib.import_module(module_name), attribute)
    if not callable(loader):
        raise TypeError(f"USER_LOADER {value!r} does not name a callable")
    return loader  # type: ignore[no-any-return]


def _is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _configured_user(name: str) -> DashboardUser | None:
    entry = dashboard_config().get("USERS", {}).get(name)
    if not isinstance(entry, dict):
        return None
    return DashboardUser(name, str(entry.get("role", "viewer")))


def _load_user() -> DashboardUser | None:
    loader = _resolve_loader(dashboard_config().get("USER_LOADER")) or state().user_loader
    if loader is not None:
        return loader(request)
    name = session.get(USER_KEY)
    if name:
        return _configured_user(str(name))
    if dashboard_config().get("DEMO") and _is_loopback(request.remote_addr):
        return DashboardUser(DEMO_USER, "operator")
    return None


def _is_public(path: str) -> bool:
    """``path`` (relative to where the dashboard is mounted) is served without a login."""
    return any(
        path == prefix or (prefix.endswith("/") and path.startswith(prefix))
        for prefix in dashboard_config()["PUBLIC_PATHS"]
    )


def _dashboard_path() -> str:
    prefix = state().url_prefix
    return request.path[len(prefix) :] or "/" if prefix else request.path


def clear_session() -> None:
    """Forget the dashboard's keys, and only those: a host's own session keys stay."""
    for key in [key for key in session if str(key).startswith(SESSION_PREFIX)]:
        session.pop(key)


def authorize() -> Response | None:
    """Before every request: find the user, send strangers to the login, keep viewers read-only."""
    g.user = _load_user()
    if _is_public(_dashboard_path()) or current_endpoint() == "auth.logout":
        return None
    if g.user is None:
        next_url = request.full_path.rstrip("?")
        host_login = state().login_url
        target = (host_login(next_url) if host_login else None) or url_for(
            "auth.login", next=next_url
        )
        if getattr(request, "htmx", False):
            # A redirect would be followed by XHR and swapped into the page; tell htmx instead.
            return Response(status=401, headers={"HX-Redirect": target})
        return redirect(target)  # type: ignore[return-value]
    if request.method not in csrf.SAFE_METHODS and not g.user.can_act:
        abort(403, description=f"{g.user.name} is a viewer; viewers cannot change workflows.")
    return None


def _safe_next(target: str | None) -> str:
    # Only same-site paths: an open redirect after login would be a phishing aid.
    if target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and target.startswith("/"):
            return target
    return url_for("dashboard.overview")


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    error = None
    status = 200
    if request.method == "POST":
        name = request.form.get("username", "").strip()
        password = request.form.get("password", "")
        keys = [f"addr:{request.remote_addr}", f"user:{name.lower()}"]
        limiter = state().login_limiter
        limit = int(dashboard_config().get("LOGIN_MAX_FAILURES", DEFAULT_MAX_FAILURES))
        window = float(dashboard_config().get("LOGIN_WINDOW_SECONDS", DEFAULT_WINDOW_SECONDS))
        wait = limiter.retry_after(keys, limit, window)
        if wait:
            message = f"Too many failed logins. Try again in {wait} seconds."
            page = render_template("auth/login.html", error=message, next="", demo=_demo_open())
            return page, 429, {"Retry-After": str(wait)}
        entry = dashboard_config().get("USERS", {}).get(name)
        hashed = entry.get("password_hash") if isinstance(entry, dict) else None
        if hashed and check_password_hash(str(hashed), password):
            limiter.clear(keys)
            clear_session()  # a fresh session on login: no fixation of a pre-login cookie
            session[USER_KEY] = name
            csrf.csrf_token()
            return redirect(_safe_next(request.args.get("next")))
        limiter.fail(keys)
        error = "Unknown user or wrong password."
        status = 401
    return (
        render_template(
            "auth/login.html", error=error, next=request.args.get("next", ""), demo=_demo_open()
        ),
        status,
    )


def _demo_open() -> bool:
    return bool(dashboard_config().get("DEMO")) and _is_loopback(request.remote_addr)


@bp.route("/logout", methods=["GET", "POST"])
def logout() -> Any:
    if request.method == "POST":
        clear_session()
        return redirect(url_for("auth.login"))
    # State never changes on GET: show a button that POSTs.
    return render_template("auth/logout.html")
