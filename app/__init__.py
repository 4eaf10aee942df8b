"""The Flask ops dashboard (app factory).

``create_app(config)`` builds the dashboard: configuration (defaults < ``GENEVA_*``
environment < ``config``), Flask-SQLAlchemy bound to the engine's metadata, Flask-Migrate,
htmx-flask, login and roles, CSRF, security headers, and the blueprints. To add a blueprint
(``/metrics`` and friends), register it in :func:`register_blueprints`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask

import geneva_drive.db
from geneva_drive.dashboard import auth, config, csrf, errors, formatting, security
from geneva_drive.dashboard import htmx as htmx_helpers
from geneva_drive.dashboard.extensions import db, htmx, migrate

# Not resolve()d: in the strict editable install the package is a tree of links, and the
# templates, static files and migrations sit beside this file there as they do in the wheel.
HERE = Path(__file__).parent
MIGRATIONS = HERE.parent / "migrations"
log = logging.getLogger(__name__)


def create_app(config_overrides: Mapping[str, Any] | None = None) -> Flask:
    """Build the dashboard. ``{"DEMO": True}`` opens it to loopback clients as operator."""
    app = Flask(
        __name__,
        template_folder=str(HERE / "templates"),
        static_folder=str(HERE / "static"),
    )
    # Ids in URLs are BIGINTs: a larger number is a 404, not an overflow in the database driver.
    app.url_map.converters["int"] = security.BoundedIntConverter
    config.load(app, config_overrides)
    if app.config["SECRET_KEY"] == config.DEV_SECRET_KEY and not (
        app.config.get("DEMO") or app.testing
    ):
        log.warning("GENEVA_SECRET_KEY is not set: sessions are signed with a public dev key")
    _import_workflow_modules(app.config.get("WORKFLOW_MODULES"))

    uri = app.config.get("SQLALCHEMY_DATABASE_URI")
    if isinstance(uri, str) and geneva_drive.db.is_mysql_url(uri):
        # READ COMMITTED, utf8mb4, a UTC session: the engine's MariaDB/MySQL settings
        # (engine/db.py), since the workers of `geneva-drive up` run on this engine too.
        app.config["SQLALCHEMY_ENGINE_OPTIONS"] = geneva_drive.db.mysql_engine_options(
            uri, app.config.get("SQLALCHEMY_ENGINE_OPTIONS")
        )
    db.init_app(app)
    migrate.init_app(app, db, directory=str(MIGRATIONS))
    htmx.init_app(app)
    with app.app_context():
        sa_engine = db.engine
        if sa_engine.dialect.name == "sqlite":
            # WAL and busy_timeout, as the engine's own connections get: operator actions take
            # the write lock (BEGIN IMMEDIATE) and must wait for a worker's commit, not fail.
            geneva_drive.db.install_sqlite_pragmas(sa_engine)
            sa_engine.dispose()
        elif "pool_pre_ping" not in app.config.get("SQLALCHEMY_ENGINE_OPTIONS", {}):
            # The engine's liveness check (engine/db.py): a connection that sat idle is tested
            # before a request (or a step of `geneva-drive up`'s worker) uses it.
            geneva_drive.db.install_idle_ping(sa_engine, geneva_drive.db.pool_ping_after())
        # The engine's own session factory uses the same database as Flask-SQLAlchemy.
        geneva_drive.db.configure(engine=sa_engine)

    # Order matters: CSRF refuses forged requests before auth looks at who sent them.
    csrf.init_app(app)
    auth.init_app(app)
    security.init_app(app)
    htmx_helpers.init_app(app)
    errors.init_app(app)
    formatting.init_app(app)
    register_blueprints(app)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        db.session.execute(db.text("SELECT 1"))
        return {"status": "ok", "database": "ok"}

    return app


def register_blueprints(app: Flask) -> None:
    """Every blueprint of the dashboard (``auth`` registers itself in ``auth.init_app``)."""
    from geneva_drive.dashboard import metrics
    from geneva_drive.dashboard.dashboard import bp as dashboard_bp
    from geneva_drive.dashboard.workflows import bp as workflows_bp

    app.register_blueprint(dashboard_bp)
    app.register_blueprint(workflows_bp)
    metrics.init_app(app)  # GET /metrics (Prometheus); also installs the event metrics


def _import_workflow_modules(value: Any) -> None:
    """``GENEVA_WORKFLOW_MODULES=pkg.mod,…``: import them so their classes are registered."""
    if not value:
        return
    names = value.split(",") if isinstance(value, str) else list(value)
    for name in names:
        if name.strip():
            importlib.import_module(name.strip())
