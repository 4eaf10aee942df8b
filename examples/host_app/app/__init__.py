"""myshop: a Flask + Flask-SQLAlchemy shop with its own login, models and migrations, which
runs its order workflow on GenevaDrive and mounts the dashboard at ``/admin/workflows``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery
from flask import Flask
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from geneva_drive.dashboard import GenevaDrive
from geneva_drive.migrations import exclude_engine_tables

db = SQLAlchemy()
login_manager = LoginManager()
login_manager.login_view = "shop.login"
# The shop's own migration history leaves GenevaDrive's tables to GenevaDrive's history.
migrate = Migrate(include_object=exclude_engine_tables)
geneva = GenevaDrive()


def make_celery(app: Flask) -> Celery:
    celery = Celery(app.import_name, broker=app.config["CELERY_BROKER_URL"])
    celery.conf.update(task_ignore_result=True, worker_prefetch_multiplier=1)
    return celery


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(
        # From the environment, never a default in the code: a key in a repository is public,
        # and GenevaDrive refuses to mount on a missing, short or published key (make one with
        # python -c 'import secrets; print(secrets.token_urlsafe(32))').
        SECRET_KEY=os.environ.get("SHOP_SECRET_KEY"),
        SQLALCHEMY_DATABASE_URI=os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.sqlite3"),
        CELERY_BROKER_URL=os.environ.get("SHOP_BROKER_URL", "redis://127.0.0.1:6379/0"),
        # GenevaDrive reads GENEVA_* keys from the host's config (the environment as fallback).
        GENEVA_URL_PREFIX="/admin/workflows",
    )
    if config:
        app.config.update(config)

    db.init_app(app)
    migrate.init_app(app, db, directory=os.path.join(os.path.dirname(__file__), "..", "migrations"))
    login_manager.init_app(app)
    celery = make_celery(app)
    app.extensions["celery"] = celery

    from app import models, views, workflows  # noqa: F401  (models, routes, workflow classes)

    # Reuses db's engine and session, the shop's login (User.geneva_drive_role), and sends
    # step messages through the shop's own Celery app.
    geneva.init_app(app, db=db, celery=celery)
    app.register_blueprint(views.bp)
    return app
