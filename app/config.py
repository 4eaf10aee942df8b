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

from collections.abc import Mapping
from typing import Any

from flask import Flask

import geneva_drive.db

#: The secret used when none is configured. Sessions signed with it are forgeable, so the
#: factory logs a warning unless the app is in demo or testing mode.
DEV_SECRET_KEY = "dev-only-change-me"

DEFAULTS: dict[str, Any] = {
    "SECRET_KEY": DEV_SECRET_KEY,
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
    #: Failed logins allowed per client address and per username within the window (429
    #: after that; see app.ratelimit).
    "LOGIN_MAX_FAILURES": 5,
    "LOGIN_WINDOW_SECONDS": 300,
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
