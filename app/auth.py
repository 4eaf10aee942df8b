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

3. **Demo mode** (``DEMO``): requests from the loopback interface are the operator ``demo``
   without a login, when they also name a loopback ``Host`` (``localhost``, ``127.0.0.1``,
   ``[::1]``) and carry no header a proxy or CDN adds (``Forwarded``, ``Via``,
   ``X-Forwarded-*``, ``X-Real-IP``, ``X-Client-IP``, ``True-Client-IP``,
   ``CF-Connecting-IP`` and the others of :data:`PROXY_HEADERS` and :data:`PROXY_PREFIXES`).
   The TCP peer alone is not enough: a page of ``rebind.attacker.test`` resolved to 127.0.0.1
   (DNS rebinding) reaches the port from the operator's own browser, and a reverse proxy on
   the same machine makes every outside client a loopback peer. A proxy that rewrites ``Host``
   to ``localhost`` and adds no header at all is indistinguishable from a local browser: the
   demo must never sit behind a proxy (its start banner and the README say so). Anyone else
   logs in.

Built-in logins are bounded: a session lasts ``SESSION_LIFETIME_SECONDS`` from the login
however active it is, logging out ends every session of that user (the cookie carries the
user's session generation; logout bumps it in ``geneva_drive_dashboard_sessions``), and so does
a new password (the cookie carries a fingerprint of the password hash, keyed with the secret
key: a new hash in ``USERS`` and a restart, and the old cookies are nobody's).

Logins are throttled (:mod:`geneva_drive.dashboard.ratelimit`: each attempt is counted before
its password is checked, so parallel guesses cannot slip past the limit), and at most
:data:`MAX_CONCURRENT_HASHES` passwords are hashed at once: a flood of unauthenticated logins
cannot take the threads that serve signed-in operators. Under a host's login (a user loader or
Flask-Login) the built-in ``/login`` does not exist (404): it would be a second, public way in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import ipaddress
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

from flask import Blueprint, Response, abort, current_app, g, redirect, request, session
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from werkzeug.security import check_password_hash, generate_password_hash

from geneva_drive.dashboard import csrf, ratelimit
from geneva_drive.dashboard.extensions import db
from geneva_drive.dashboard.rendering import render_template
from geneva_drive.dashboard.state import dashboard_config, state
from geneva_drive.dashboard.urls import current_endpoint, url_for
from geneva_drive.errors import ConfigurationError, UsageError
from geneva_drive.logsafe import escape
from geneva_drive.models import DashboardSessionGeneration, utcnow

ROLES = ("viewer", "operator")
DEMO_USER = "demo"
#: Headers a proxy, load balancer or CDN adds: a request carrying one came through a proxy,
#: whatever its TCP peer (lower case).
PROXY_HEADERS = frozenset(
    {
        "forwarded",
        "via",
        "x-real-ip",
        "x-client-ip",
        "client-ip",
        "true-client-ip",
        "x-cluster-client-ip",
        "x-proxyuser-ip",
        "x-host",
        "x-remote-ip",
        "x-remote-addr",
        "x-proxy-id",
        "x-request-start",
        "cdn-loop",
        "x-arr-log-id",
        "x-arr-ssl",
        "x-appengine-user-ip",
        "x-azure-clientip",
        "x-azure-socketip",
    }
)
#: Header prefixes of proxies and CDNs (X-Forwarded-For/-Host/-Proto, X-Original-Host,
#: Cloudflare's CF-*, Fastly-*, AWS's X-Amzn-*, Envoy's X-Envoy-*, Akamai's Akamai-*).
PROXY_PREFIXES = (
    "x-forwarded-",
    "x-original-",
    "cf-",
    "fastly-",
    "x-amzn-",
    "x-envoy-",
    "akamai-",
    "x-akamai-",
    "x-vercel-",
    "x-nf-",
    "x-real-",
)
#: What ``geneva-drive up --demo`` prints at start.
DEMO_BANNER = (
    "Demo mode: requests from this machine are the operator 'demo', without a login. It must "
    "never sit behind a proxy: a reverse proxy that rewrites Host to localhost is "
    "indistinguishable from a local browser and would hand operator rights to every client."
)
LOOPBACK_NAMES = frozenset({"localhost"})
#: The dashboard's keys in the session, all under one prefix: mounted in a host app, the
#: session (and its cookie) is the host's, and the dashboard touches only its own keys.
SESSION_PREFIX = "geneva_drive."
USER_KEY = "geneva_drive.user"
ISSUED_KEY = "geneva_drive.iat"
GENERATION_KEY = "geneva_drive.gen"
PASSWORD_KEY = "geneva_drive.pwd"
#: Passwords hashed at once, at most (scrypt takes tens of milliseconds of CPU each): the
#: server's other threads stay free for signed-in operators whatever the login traffic.
MAX_CONCURRENT_HASHES = 2
#: Seconds a login waits for a hashing slot before it is answered 503.
HASH_WAIT_SECONDS = 2.0
_hashing = threading.BoundedSemaphore(MAX_CONCURRENT_HASHES)

log = logging.getLogger(__name__)

bp = Blueprint("auth", __name__)


class UnknownRoleError(ValueError):
    """A user's role is neither of :data:`ROLES`: a configuration mistake, answered 403."""


@dataclass(frozen=True)
class DashboardUser:
    """The person behind a request: a display name and a role.

    ``user_id`` is the host's stable id of the user, when the user comes from a host's login:
    the audit log records it beside the display name (``host:<id> <name>``), so a host user who
    renames themselves (``cli:root``, another operator's name) cannot pose as someone else.
    The role is read case-insensitively (``"Operator"`` is ``"operator"``).
    """

    name: str
    role: str
    user_id: str | None = None

    def __post_init__(self) -> None:
        role = str(self.role).strip().lower()
        if role not in ROLES:
            raise UnknownRoleError(
                f"Unknown dashboard role {self.role!r} for {self.name!r}: use one of "
                f"{', '.join(ROLES)} (or give the user no access at all)"
            )
        object.__setattr__(self, "role", role)

    @property
    def can_act(self) -> bool:
        return self.role == "operator"

    @property
    def actor(self) -> str:
        """Who the audit log says acted: the name, under the host's stable id when there is one."""
        return f"host:{self.user_id} {self.name}" if self.user_id is not None else self.name


def current_user() -> DashboardUser | None:
    user: DashboardUser | None = g.get("user")
    return user


def resolve_callable(value: Any, setting: str) -> Callable[..., Any] | None:
    """``value`` itself when callable, else the callable a ``"module:attribute"`` string names."""
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    module_name, _, attribute = str(value).partition(":")
    found = getattr(importlib.import_module(module_name), attribute)
    if not callable(found):
        raise ConfigurationError(f"GENEVA_{setting} {value!r} does not name a callable")
    return found  # type: ignore[no-any-return]


def _resolve_loader(value: Any) -> Callable[[Any], DashboardUser | None] | None:
    return resolve_callable(value, "USER_LOADER")


def _is_loopback(address: str | None) -> bool:
    if not address:
        return False
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """The name part of a ``Host`` header value (no port; an IPv6 literal without brackets)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def _is_loopback_host(host: str) -> bool:
    name = _host_name(host.strip().lower()).rstrip(".")
    return name in LOOPBACK_NAMES or _is_loopback(name)


def _is_forwarded() -> bool:
    return any(
        key.lower() in PROXY_HEADERS or key.lower().startswith(PROXY_PREFIXES)
        for key, _value in request.headers
    )


def _demo_open() -> bool:
    """Demo access for this request: loopback peer, loopback ``Host``, no proxy headers."""
    return (
        bool(dashboard_config().get("DEMO"))
        and _is_loopback(request.remote_addr)
        and _is_loopback_host(request.host)
        and not _is_forwarded()
    )


# --- sessions: bounded lifetime, ended by logout -------------------------------------------------


def _generation(name: str) -> int:
    row = db.session.get(DashboardSessionGeneration, name)
    return int(row.generation) if row is not None else 0


def end_sessions(name: str) -> None:
    """Bump ``name``'s session generation: every session issued before stops acting."""
    for _ in range(3):
        result = db.session.execute(
            update(DashboardSessionGeneration)
            .where(DashboardSessionGeneration.name == name)
            .values(generation=DashboardSessionGeneration.generation + 1, updated_at=utcnow())
        )
        if getattr(result, "rowcount", 0):
            db.session.commit()
            return
        db.session.add(DashboardSessionGeneration(name=name, generation=1, updated_at=utcnow()))
        try:
            db.session.commit()
            return
        except IntegrityError:  # another logout inserted it meanwhile: bump that row
            db.session.rollback()
    raise UsageError(f"could not end the sessions of {name!r}")


def clear_session() -> None:
    """Forget the dashboard's keys, and only those: a host's own session keys stay."""
    for key in [key for key in session if str(key).startswith(SESSION_PREFIX)]:
        session.pop(key)


def password_fingerprint(name: str) -> str:
    """A fingerprint of ``name``'s configured password hash, keyed with the secret key.

    The session cookie is signed, not encrypted: keyed, the fingerprint tells its reader
    nothing about the hash. A new hash gives a new fingerprint, so the sessions of the old
    password end."""
    entry = dashboard_config().get("USERS", {}).get(name)
    hashed = str(entry.get("password_hash") or "") if isinstance(entry, dict) else ""
    key = current_app.secret_key
    key_bytes = key.encode() if isinstance(key, str) else bytes(key or b"")
    digest = hmac.new(key_bytes, b"geneva_drive.password\x00" + hashed.encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()[:16]).decode().rstrip("=")


def start_session(name: str) -> None:
    """Log ``name`` in on this request's session (a fresh one: no fixation of a pre-login
    cookie), stamped with the login time, the current session generation and the password's
    fingerprint."""
    clear_session()
    session[USER_KEY] = name
    session[ISSUED_KEY] = int(time.time())
    session[GENERATION_KEY] = _generation(name)
    session[PASSWORD_KEY] = password_fingerprint(name)
    csrf.csrf_token()


def _session_is_current(name: str) -> bool:
    issued = session.get(ISSUED_KEY)
    if not isinstance(issued, int | float) or isinstance(issued, bool):
        return False
    age = time.time() - issued
    lifetime = float(dashboard_config()["SESSION_LIFETIME_SECONDS"])
    if age > lifetime or age < -60:  # expired, or stamped in the future (clock or forgery)
        return False
    fingerprint = session.get(PASSWORD_KEY)
    if not isinstance(fingerprint, str) or not hmac.compare_digest(
        fingerprint, password_fingerprint(name)
    ):
        return False  # the password changed since this login (or the cookie predates this rule)
    generation = session.get(GENERATION_KEY, 0)
    return isinstance(generation, int) and generation == _generation(name)


def _configured_user(name: str) -> DashboardUser | None:
    entry = dashboard_config().get("USERS", {}).get(name)
    if not isinstance(entry, dict):
        return None
    return DashboardUser(name, str(entry.get("role", "viewer")))


def _refuse_unknown_role(error: UnknownRoleError) -> NoReturn:
    log.error("Dashboard access refused: %s", escape(str(error), 300))
    abort(403, description=f"{error}. (Roles are {' and '.join(ROLES)}.)")


def _load_user() -> DashboardUser | None:
    loader = _resolve_loader(dashboard_config().get("USER_LOADER")) or state().user_loader
    if loader is not None:
        try:
            return loader(request)
        except UnknownRoleError as error:  # the host's role names: a clear 403, not a 500
            _refuse_unknown_role(error)
    name = session.get(USER_KEY)
    if name:
        if _session_is_current(str(name)):
            try:
                return _configured_user(str(name))
            except UnknownRoleError as error:
                _refuse_unknown_role(error)
        clear_session()  # expired or logged out: the cookie is replaced by an anonymous one
    if _demo_open():
        return DashboardUser(DEMO_USER, "operator")
    return None


def _is_public(path: str) -> bool:
    """``path`` (relative to where the dashboard is mounted) is served without a login."""
    return any(
        path == prefix or (prefix.endswith("/") and path.startswith(prefix))
        for prefix in dashboard_config()["PUBLIC_PATHS"]
    )


def uses_own_login() -> bool:
    """Whether signing in and out is the dashboard's (its ``/login``), not a host's: with a
    host's login (a user loader, Flask-Login) logging out is the host's page, so the dashboard
    shows no Log out button of its own."""
    return dashboard_config().get("USER_LOADER") is None and state().user_loader is None


def _dashboard_path() -> str:
    prefix = state().url_prefix
    return request.path[len(prefix) :] or "/" if prefix else request.path


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
        g.geneva_refusal = "forbidden"
        abort(403, description=f"{g.user.name} is a viewer; viewers cannot change workflows.")
    return None


def _safe_next(target: str | None) -> str:
    # Only same-site paths: an open redirect after login would be a phishing aid. A backslash
    # is refused too (browsers read "/\\evil.example" as "//evil.example"), and so are control
    # characters (CR/LF would split the Location header).
    if target and target.startswith("/") and target.isprintable() and "\\" not in target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc:
            return target
    return url_for("dashboard.overview")


def _limits() -> ratelimit.Limits:
    config = dashboard_config()
    return ratelimit.Limits(
        pair=int(config["LOGIN_MAX_FAILURES"]),
        user=int(config["LOGIN_MAX_FAILURES_PER_USER"]),
        address=int(config["LOGIN_MAX_FAILURES_PER_ADDRESS"]),
        window=float(config["LOGIN_WINDOW_SECONDS"]),
        backoff=float(config["LOGIN_BACKOFF_SECONDS"]),
    )


def _dummy_hash() -> str:
    """A hash of a random password, made like the configured users' hashes (same method and
    cost), checked for unknown names so that they cost what known names cost: the answer's
    timing must not tell which names exist."""
    methods = [
        str(entry["password_hash"]).partition("$")[0]
        for entry in dashboard_config().get("USERS", {}).values()
        if isinstance(entry, dict) and entry.get("password_hash")
    ]
    method = max(set(methods), key=methods.count) if methods else "scrypt"
    cache: dict[str, str] = current_app.extensions.setdefault("geneva_drive.dummy_hashes", {})
    if method not in cache:
        try:
            cache[method] = generate_password_hash(secrets.token_urlsafe(16), method=method)
        except (ValueError, TypeError):  # a method werkzeug cannot make: its default then
            cache[method] = generate_password_hash(secrets.token_urlsafe(16))
    return cache[method]


def _password_matches(name: str, password: str) -> bool:
    entry = dashboard_config().get("USERS", {}).get(name)
    hashed = entry.get("password_hash") if isinstance(entry, dict) else None
    if not hashed:
        check_password_hash(_dummy_hash(), password)  # the same work, thrown away
        return False
    return check_password_hash(str(hashed), password)


def _login_page(error: str | None, status: int, next_url: str) -> Any:
    page = render_template("auth/login.html", error=error, next=next_url, demo=_demo_open())
    return page, status


def _check_password(name: str, password: str) -> bool | None:
    """Whether ``password`` is ``name``'s, or None when no hashing slot came free in time."""
    if not _hashing.acquire(timeout=HASH_WAIT_SECONDS):
        return None
    try:
        return _password_matches(name, password)
    finally:
        _hashing.release()


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    if not uses_own_login():
        # The host signs people in: a second, public login would be a way around it (and a
        # way to make this process hash passwords for anyone).
        abort(404)
    next_url = request.args.get("next", "")
    if request.method != "POST":
        return _login_page(None, 200, next_url)
    name = request.form.get("username", "").strip()
    password = request.form.get("password", "")
    address = request.remote_addr
    keys = ratelimit.keys_for(name, address)
    limiter = state().login_limiter
    limits = _limits()
    # Counted as a failure before the password is checked (and taken back on success): 30
    # parallel guesses meet the limit as 30 sequential ones do.
    attempt = limiter.attempt(keys, limits)
    if attempt.wait:
        log.warning(
            "Login throttled: user %s from %s, %s s to wait",
            escape(name, 100),
            address,
            attempt.wait,
        )
        body, status = _login_page(
            f"Too many failed logins. Try again in {attempt.wait} seconds.", 429, ""
        )
        return body, status, {"Retry-After": str(attempt.wait)}
    matches = _check_password(name, password)
    if matches is None:
        limiter.withdraw(attempt)  # not a guess: the password was never looked at
        log.warning("Login deferred: too many logins at once (user %s)", escape(name, 100))
        body, status = _login_page("Too many logins at once. Try again in a moment.", 503, "")
        return body, status, {"Retry-After": "2"}
    if matches:
        limiter.succeed(attempt)
        start_session(name)
        log.info("Login: user %s from %s", escape(name, 100), address)
        return redirect(_safe_next(next_url))
    log.warning(
        "Failed login: user %s from %s (%d failures of this user from this address in %d s)",
        escape(name, 100),
        address,
        limiter.failures(keys["pair"], limits.window),
        limits.window,
    )
    return _login_page("Unknown user or wrong password.", 401, next_url)


@bp.route("/logout", methods=["GET", "POST"])
def logout() -> Any:
    if request.method == "POST":
        name = session.get(USER_KEY)
        if name and g.get("user") is not None:
            end_sessions(str(name))  # every copy of this cookie stops acting, not just ours
            log.info("Logout: user %s from %s", escape(str(name), 100), request.remote_addr)
        clear_session()
        return redirect(url_for("auth.login"))
    # State never changes on GET: show a button that POSTs.
    return render_template("auth/logout.html")
