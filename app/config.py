"""Dashboard configuration: defaults, then ``GENEVA_*`` environment variables, then the mapping
passed to :func:`app.create_app`.

Every key below can be set from the environment with the ``GENEVA_`` prefix
(``GENEVA_DEMO=true``, ``GENEVA_BULK_CAP=500``, ``GENEVA_SECRET_KEY=...``). Values are parsed
as JSON when they are valid JSON (Flask's ``from_prefixed_env``), so users are configured as::

    GENEVA_USERS='{"alice": {"password_hash": "scrypt:...", "role": "operator"},
                   "bob":   {"password_hash": "scrypt:...", "role": "viewer"}}'

with hashes made by ``werkzeug.security.generate_password_hash``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask

import geneva_drive.db
from geneva_drive.errors import ConfigurationError

__all__ = ["ConfigurationError", "check_secret_key", "for_host", "load"]

#: A key published in this repository's history: sessions signed with it are forgeable (and so
#: is their CSRF token, which lives in the session), so it is refused like no key at all.
DEV_SECRET_KEY = "dev-only-change-me"
#: Shortest secret key accepted: a key short enough to guess signs sessions anyone can forge.
MIN_SECRET_KEY_LENGTH = 16
HOW_TO_MAKE_A_KEY = (
    "Set GENEVA_SECRET_KEY to a long random value, the same for every process of the "
    "dashboard, e.g. the output of: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
)


DEFAULTS: dict[str, Any] = {
    #: No default: outside demo and tests the factory refuses to start without one.
    "SECRET_KEY": None,
    #: Open access as operator "demo" for loopback clients (``geneva-drive up --demo``).
    "DEMO": False,
    #: ``{username: {"password_hash": ..., "role": "viewer" | "operator"}}``.
    "USERS": {},
    #: The host application's login: a callable ``(request) -> DashboardUser | None`` or a
    #: ``"module:attribute"`` string naming one. When set it replaces the built-in login.
    "USER_LOADER": None,
    #: Paths served without a login (liveness probes and Prometheus scrapes).
    "PUBLIC_PATHS": ("/healthz", "/metrics", "/static/", "/login"),
    #: Rows per page on lists (keyset pages; never an OFFSET).
    "PAGE_SIZE": 50,
    #: Most workflows one bulk action may touch (Oban Web's default; Mission Control uses 3000).
    "BULK_CAP": 1000,
    #: Seconds between polls of live regions.
    "POLL_SECONDS": 5,
    #: Seconds the overview's grouped counts are cached per process.
    "COUNTS_CACHE_SECONDS": 5,
    #: Largest request body accepted (413 above it); signal payloads are capped far lower by
    #: the engine (``max_signal_payload_size``), this stops a huge body before it is parsed.
    "MAX_CONTENT_LENGTH": 1024 * 1024,
    #: Failed logins allowed per (username, client address) within the window; after that
    #: each further attempt of that pair waits longer (see app.ratelimit).
    "LOGIN_MAX_FAILURES": 5,
    "LOGIN_WINDOW_SECONDS": 300,
    #: The first wait after LOGIN_MAX_FAILURES; it doubles with each further failure, up to the
    #: window.
    "LOGIN_BACKOFF_SECONDS": 2,
    #: Failed logins allowed per username from all addresses together, and per address for all
    #: usernames together, within the window (looser than the per-pair limit: an attacker who
    #: rotates addresses is slowed down without a handful of guesses locking the user out).
    "LOGIN_MAX_FAILURES_PER_USER": 50,
    "LOGIN_MAX_FAILURES_PER_ADDRESS": 50,
    #: Seconds a login lasts, however active the session: after that the user logs in again.
    "SESSION_LIFETIME_SECONDS": 12 * 3600,
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_SECURE": False,
    "SQLALCHEMY_TRACK_MODIFICATIONS": False,
    #: Where ``GenevaDrive(app, db=db)`` mounts the dashboard in a host app (``url_prefix=``
    #: wins). The standalone app serves it at the root.
    "URL_PREFIX": "/geneva",
}

#: Keys that belong to Flask (and its extensions), not to the dashboard: a host app keeps its
#: own values for these; only the standalone app takes ours.
FLASK_KEYS = frozenset(
    {
        "SECRET_KEY",
        "MAX_CONTENT_LENGTH",
        "SESSION_COOKIE_HTTPONLY",
        "SESSION_COOKIE_SAMESITE",
        "SESSION_COOKIE_SECURE",
        "SQLALCHEMY_TRACK_MODIFICATIONS",
    }
)


def for_host(app: Flask, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The dashboard's settings inside a host app: defaults, then ``GENEVA_*`` environment
    variables, then the host's ``app.config["GENEVA_*"]``, then ``overrides`` (later wins).

    Prefixed in the host's config so they never collide with the host's own keys; parsed from
    the environment as :func:`load` does (JSON when it is valid JSON).
    """
    scratch = Flask(__name__)  # from_prefixed_env's parsing, without touching the host's config
    scratch.config.clear()
    scratch.config.from_prefixed_env("GENEVA")
    from_host = {k[len("GENEVA_") :]: v for k, v in app.config.items() if k.startswith("GENEVA_")}
    settings: dict[str, Any] = {k: v for k, v in DEFAULTS.items() if k not in FLASK_KEYS}
    for source in (scratch.config, from_host):
        settings.update({k: v for k, v in source.items() if k not in FLASK_KEYS})
    if overrides:
        settings.update(overrides)
    return settings


def load(app: Flask, overrides: Mapping[str, Any] | None) -> None:
    """Apply defaults, the environment and ``overrides``, in that order (later wins)."""
    app.config.update(DEFAULTS)
    app.config.from_prefixed_env("GENEVA")
    if overrides:
        app.config.update(overrides)
    if not app.config.get("SQLALCHEMY_DATABASE_URI"):
        # GENEVA_DATABASE_URL (also read above as DATABASE_URL), refused when unset.
        app.config["SQLALCHEMY_DATABASE_URI"] = app.config.get("DATABASE_URL") or (
            geneva_drive.db.database_url()
        )


def secret_key_problem(key: Any) -> str | None:
    """Why ``key`` cannot sign sessions, or None when it can."""
    if not key:
        return "GENEVA_SECRET_KEY is not set"
    if not isinstance(key, str | bytes):
        return "GENEVA_SECRET_KEY must be a string"
    if key in (DEV_SECRET_KEY, DEV_SECRET_KEY.encode()):
        return "GENEVA_SECRET_KEY is the public development key"
    if len(key) < MIN_SECRET_KEY_LENGTH:
        return f"GENEVA_SECRET_KEY is shorter than {MIN_SECRET_KEY_LENGTH} characters"
    return None


def check_secret_key(app: Flask, *, required: bool) -> None:
    """Refuse a missing or public key outside demo and tests; demo gets a random key per run.

    Sessions are signed cookies holding the user and the CSRF token: whoever knows the key can
    be anyone, so there is no fallback key. A demo's key lives only in its process, so its
    sessions end with it (and it is never the same on two machines).
    """
    problem = secret_key_problem(app.config.get("SECRET_KEY"))
    if problem is None:
        return
    if app.config.get("DEMO"):
        app.config["SECRET_KEY"] = secrets.token_urlsafe(32)
    elif app.testing or not required:
        # Tests set their own key; a factory that only migrates signs nothing. Either way a
        # key nobody can know, never the public one.
        app.config["SECRET_KEY"] = app.config.get("SECRET_KEY") or secrets.token_urlsafe(32)
        if app.config["SECRET_KEY"] == DEV_SECRET_KEY:
            app.config["SECRET_KEY"] = secrets.token_urlsafe(32)
    else:
        raise ConfigurationError(f"Refusing to start: {problem}. {HOW_TO_MAKE_A_KEY}")
