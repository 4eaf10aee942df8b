"""The Flask ops dashboard (app factory)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask

import engine.db
from app.extensions import db, migrate

ROOT = Path(__file__).resolve().parent.parent


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    app = Flask(
        __name__,
        template_folder=str(ROOT / "templates"),
        static_folder=str(ROOT / "static"),
    )
    app.config["SQLALCHEMY_DATABASE_URI"] = engine.db.database_url()
    app.config["SECRET_KEY"] = os.environ.get("GENEVA_SECRET_KEY", "dev-only-change-me")
    app.config.from_prefixed_env("GENEVA")
    if config:
        app.config.update(config)
    db.init_app(app)
    migrate.init_app(app, db, directory=str(ROOT / "migrations"))
    with app.app_context():
        # The engine's own session factory uses the same database as Flask-SQLAlchemy.
        engine.db.configure(engine=db.engine)

    from app import metrics

    metrics.init_app(app)  # GET /metrics (Prometheus); also installs the event metrics

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        db.session.execute(db.text("SELECT 1"))
        return {"status": "ok", "database": "ok"}

    return app
