"""``GenevaDrive``: the dashboard and the engine inside a host's Flask app.

In the Flask-SQLAlchemy style::

    db = SQLAlchemy()
    geneva = GenevaDrive()

    def create_app():
        app = Flask(__name__)
        app.config.from_mapping(GENEVA_URL_PREFIX="/admin/workflows")
        db.init_app(app)
        geneva.init_app(app, db=db, celery=celery_app)
        return app

It reuses the host's Flask-SQLAlchemy engine (the engine's own sessions, workers and the
dispatcher use it too), mounts the dashboard Blueprint at ``GENEVA_URL_PREFIX``, takes the
signed-in user from the host (Flask-Login's ``current_user`` with ``role_for``, or a
``user_loader``), and keeps the dashboard's session keys apart from the host's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from flask import Flask, abort

from geneva_drive import celery as geneva_celery
from geneva_drive import db as engine_db
from geneva_drive import transport
from geneva_drive.bootstrap import import_workflow_modules, workflow_module_names
from geneva_drive.dashboard import api, blueprint, config, metrics, security
from geneva_drive.dashboard.api.tokens import ApiAuth
from geneva_drive.dashboard.auth import DashboardUser, resolve_callable
from geneva_drive.dashboard.state import KEY, DashboardState
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery
    from flask_sqlalchemy import SQLAlchemy
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

UserLoader = Callable[[Any], DashboardUser | None]
RoleFor = Callable[[Any], str | None]
#: ``(host user) -> display name`` for the audit log and the page header.
ActorName = Callable[[Any], str]


def default_role_for(user: Any) -> str | None:
    """The host user's ``geneva_drive_role`` attribute (``"operator"``, ``"viewer"`` or None)."""
    role = getattr(user, "geneva_drive_role", None)
    return str(role) if role else None


class FlaskLoginUsers:
    """The dashboard user behind Flask-Login's ``current_user``.

    An anonymous visitor gets ``None`` (and so the host's login page); a signed-in host user
    whose ``role_for`` is ``None`` is refused with a 403: they are who they say, and not allowed.
    The display name is ``actor_name(user)`` when the host gives that hook, else the user's
    ``name`` or id; the audit log stores it under the user's stable id (``get_id()``), so a name
    the user chose (``cli:root``) cannot pass for another actor.
    """

    def __init__(self, role_for: RoleFor, actor_name: ActorName | None = None) -> None:
        self.role_for = role_for
        self.actor_name = actor_name

    def __call__(self, _request: Any) -> DashboardUser | None:
        from flask_login import current_user  # optional: only hosts using Flask-Login get here

        user = current_user
        if user is None or not getattr(user, "is_authenticated", False):
            return None
        user_id = str(user.get_id())
        if self.actor_name is not None:
            name = str(self.actor_name(user))
        else:
            name = str(getattr(user, "name", None) or user_id)
        # Known before the role is: a refusal (no role, an unknown one) is audited under the
        # same actor as this user's allowed actions, not as an anonymous visitor.
        security.note_refused_actor(f"host:{user_id} {name}")
        role = self.role_for(user)
        if role is None:
            abort(403, description=f"{name} may not use the workflow dashboard.")
        return DashboardUser(name, role, user_id=user_id)


def flask_login_url(app: Flask) -> Callable[[str], str | None] | None:
    manager = getattr(app, "login_manager", None)
    if manager is None or not getattr(manager, "login_view", None):
        return None

    def login_url(next_url: str) -> str | None:
        from flask_login import login_url as make_login_url

        return str(make_login_url(manager.login_view, next_url=next_url))

    return login_url


def normalized_prefix(value: Any) -> str:
    prefix = str(value or "").strip()
    if not prefix.startswith("/") or prefix == "/" or "//" in prefix:
        raise ConfigurationError(
            f"GENEVA_URL_PREFIX={value!r} is not a URL path to mount the dashboard at: use "
            "one like '/admin/workflows' (leading slash, not the site root)"
        )
    return prefix.rstrip("/")


def adopt_engine(sa_engine: Any, flask_config: Mapping[str, Any]) -> None:
    """Point the engine at the app's database engine, with the engine's connection settings."""
    dialect = dialect_for(sa_engine)
    # SQLite: WAL and busy_timeout, as the engine's own connections get: operator actions
    # take the write lock (BEGIN IMMEDIATE) and must wait for a worker's commit, not fail.
    dialect.adopt(sa_engine)
    if dialect.idle_ping and "pool_pre_ping" not in flask_config.get(
        "SQLALCHEMY_ENGINE_OPTIONS", {}
    ):
        # The engine's liveness check (engine/db.py): a connection that sat idle is tested
        # before a request (or a step of a worker) uses it.
        engine_db.install_idle_ping(sa_engine, engine_db.pool_ping_after())
    engine_db.configure(engine=sa_engine)


def _warn_without_autogenerate_filter(app: Flask) -> None:
    """A host's Flask-Migrate without ``include_object`` would, at its next ``flask db
    migrate``, propose dropping every engine table: say so at start, not in a bad revision."""
    migrate = app.extensions.get("migrate")
    if migrate is None or getattr(migrate, "configure_args", {}).get("include_object"):
        return
    log.warning(
        "Flask-Migrate on %s has no include_object filter: `flask db migrate` will propose "
        "dropping GenevaDrive's tables. Pass include_object="
        "geneva_drive.migrations.exclude_engine_tables to Migrate(...)",
        app.import_name,
    )


def register_cli(app: Flask) -> None:
    """``flask geneva …``: the ``geneva-drive`` commands that make sense in a host (workflows,
    signal, housekeeping, …) on the host's database session and, through the engine's
    transport, the Celery app given to ``init_app`` (see :mod:`geneva_drive.dashboard.cli`)."""
    from contextlib import contextmanager

    from geneva_drive.dashboard.cli import register_flask_commands
    from geneva_drive.dashboard.operator_cli import Runtime

    def host_runtime() -> Runtime:
        state = app.extensions[KEY]

        @contextmanager
        def session_scope() -> Iterator[Session]:
            try:
                yield state.db.session()
            finally:
                state.db.session.remove()

        # The host imported its workflow classes at init_app: a class missing here is gone.
        return Runtime(session_scope, int(state.config["BULK_CAP"]), classes_loaded=True)

    register_flask_commands(app, host_runtime)


class GenevaDrive:
    """The Flask extension. ``GenevaDrive(app, db=db)`` or ``GenevaDrive().init_app(app, db=db)``."""

    def __init__(
        self,
        app: Flask | None = None,
        *,
        db: SQLAlchemy | None = None,
        url_prefix: str | None = None,
        user_loader: UserLoader | None = None,
        role_for: RoleFor | None = None,
        celery: Celery | None = None,
        actor_name: ActorName | None = None,
        api_auth: ApiAuth | None = None,
    ) -> None:
        self.db = db
        self.api_auth = api_auth
        self.url_prefix = url_prefix
        self.user_loader = user_loader
        self.role_for = role_for
        self.celery = celery
        self.actor_name = actor_name
        if app is not None:
            self.init_app(app)

    def init_app(
        self,
        app: Flask,
        *,
        db: SQLAlchemy | None = None,
        url_prefix: str | None = None,
        user_loader: UserLoader | None = None,
        role_for: RoleFor | None = None,
        celery: Celery | None = None,
        actor_name: ActorName | None = None,
        api_auth: ApiAuth | None = None,
    ) -> None:
        db = db or self.db
        if db is None:
            raise ConfigurationError(
                "GenevaDrive.init_app(app, db=db) needs the host's Flask-SQLAlchemy instance: "
                "the engine's tables live in that database and its sessions are reused"
            )
        # Sessions (the dashboard's user and CSRF token) are the host's signed cookie: a weak
        # host key opens the dashboard as surely as a weak standalone one.
        config.check_host_secret_key(app)
        settings = config.for_host(app)
        prefix = normalized_prefix(url_prefix or self.url_prefix or settings["URL_PREFIX"])
        import_workflow_modules(workflow_module_names(settings.get("WORKFLOW_MODULES")))

        loader: UserLoader | None = user_loader or self.user_loader
        login_url = None
        if loader is None and settings.get("USER_LOADER") is None and hasattr(app, "login_manager"):
            # GENEVA_ACTOR_NAME: a callable or "module:attribute" (as USER_LOADER is).
            namer = (
                actor_name
                or self.actor_name
                or resolve_callable(settings.get("ACTOR_NAME"), "ACTOR_NAME")
            )
            loader = FlaskLoginUsers(role_for or self.role_for or default_role_for, namer)
            login_url = flask_login_url(app)

        app.extensions[KEY] = DashboardState(
            config=settings,
            db=db,
            url_prefix=prefix,
            mounted=True,
            user_loader=loader,
            login_url=login_url,
        )
        # Ids in URLs are BIGINTs: a larger number is a 404, not an overflow in the driver.
        app.url_map.converters["int"] = security.BoundedIntConverter
        with app.app_context():
            adopt_engine(db.engine, app.config)
        _warn_without_autogenerate_filter(app)
        metrics.init_app(app)
        app.register_blueprint(blueprint.bp, url_prefix=prefix)
        # The HTTP API at <prefix>/api/v1, its own Blueprint: bearer tokens from
        # GENEVA_API_TOKENS, or the host's own check (api_auth), never the host's session.
        api.init_app(app, prefix, api_auth or self.api_auth)
        target = celery or self.celery
        if target is not None:
            geneva_celery.register(target)
        else:
            # The dashboard's actions and the host's own create()/signal() publish step
            # messages: without the host's Celery app that needs GENEVA_BROKER_URL (docs/MANUAL.md, "Adding GenevaDrive to an existing Flask app").
            transport.require_publisher("GenevaDrive.init_app(app) without celery=")
        register_cli(app)
