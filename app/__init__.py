"""The Flask ops dashboard.

Two ways to run it, one Blueprint (:mod:`geneva_drive.dashboard.blueprint`) behind both:

- ``create_app(config)``: the standalone dashboard, its own Flask app (defaults < ``GENEVA_*``
  environment < ``config``), with Flask-SQLAlchemy bound to the engine's metadata,
  Flask-Migrate for ``flask db upgrade``, login and roles, CSRF and security headers.
- :class:`GenevaDrive`: the Flask extension that mounts the dashboard in a host application and
  reuses the host's database, login and Celery app.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geneva_drive.bootstrap import import_workflow_modules, workflow_module_names
from geneva_drive.dialects import dialect_for_url

if TYPE_CHECKING:
    from flask import Flask

    from geneva_drive.dashboard.extension import GenevaDrive

#: Not resolve()d: in the strict editable install the package is a tree of links, and the
#: migrations sit beside this package there as they do in the wheel.
MIGRATIONS = Path(__file__).parent.parent / "migrations"
log = logging.getLogger(__name__)

__all__ = ["GenevaDrive", "create_app"]


def __getattr__(name: str) -> Any:
    # The package imports no Flask by itself: `geneva-drive workflows …` uses its queries and
    # presenters in a process without Flask (README "Operating from the command line").
    if name == "GenevaDrive":
        from geneva_drive.dashboard.extension import GenevaDrive

        return GenevaDrive
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_app(
    config_overrides: Mapping[str, Any] | None = None, *, require_secret_key: bool = True
) -> Flask:
    """Build the standalone dashboard. ``{"DEMO": True}`` opens it to loopback clients as operator.

    Raises :class:`config.ConfigurationError` without a real ``SECRET_KEY`` outside demo and
    testing mode. ``require_secret_key=False`` is for a factory that only migrates the
    database: it gets a random key and serves nobody.
    """
    from flask import Flask

    from geneva_drive.dashboard import api, blueprint, config, errors, metrics, security
    from geneva_drive.dashboard.extension import adopt_engine
    from geneva_drive.dashboard.extensions import htmx, migrate, own_db
    from geneva_drive.dashboard.state import KEY, DashboardState

    app = Flask(__name__, static_folder=None, template_folder=None)
    # Ids in URLs are BIGINTs: a larger number is a 404, not an overflow in the database driver.
    app.url_map.converters["int"] = security.BoundedIntConverter
    config.load(app, config_overrides)
    config.check_secret_key(app, required=require_secret_key)
    import_workflow_modules(workflow_module_names(app.config.get("WORKFLOW_MODULES")))

    uri = app.config.get("SQLALCHEMY_DATABASE_URI")
    if isinstance(uri, str):
        # READ COMMITTED, utf8mb4, a UTC session: the engine's MariaDB/MySQL settings
        # (engine/dialects/mysql.py), since the workers of `geneva-drive up` run on this
        # engine too.
        app.config["SQLALCHEMY_ENGINE_OPTIONS"] = dialect_for_url(uri).session_options(
            uri, app.config.get("SQLALCHEMY_ENGINE_OPTIONS")
        )
    # Every key of the standalone app's config is the dashboard's: it reads app.config itself.
    app.extensions[KEY] = DashboardState(config=app.config, db=own_db)
    own_db.init_app(app)
    migrate.init_app(app, own_db, directory=str(MIGRATIONS))
    htmx.init_app(app)
    with app.app_context():
        adopt_engine(own_db.engine, app.config)

    security.init_app(app)
    # The signature's own age limit too: a cookie is never accepted past a login's lifetime.
    app.permanent_session_lifetime = int(app.config["SESSION_LIFETIME_SECONDS"])
    errors.register(app)  # a URL that matches no route is the app's, not the Blueprint's
    metrics.init_app(app)
    # /healthz is the Blueprint's (app/dashboard/views.py): a host serves it under its prefix.
    app.register_blueprint(blueprint.bp)
    # The HTTP API beside it, never inside it: no session cookie, no CSRF (app/api).
    api.init_app(app)
    return app
