"""GenevaDrive(app, db=db) in a host app: what it refuses and warns about at start (the full
flow runs in examples/host_app's tests and tests/integration/test_wheel_host_app.py)."""

from __future__ import annotations

import logging

import pytest
from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from geneva_drive.dashboard import GenevaDrive
from geneva_drive.errors import ConfigurationError
from geneva_drive.migrations import exclude_engine_tables

_made: list[tuple[Flask, SQLAlchemy]] = []


@pytest.fixture(autouse=True)
def _a_broker(monkeypatch):
    """These host apps are given a broker (without one, or the host's Celery app, the
    extension refuses to start: tests/integration/test_no_silent_broker.py)."""
    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")


@pytest.fixture(autouse=True)
def _dispose_host_engines():
    """Each host app's Flask-SQLAlchemy engine is closed with its test: a pooled connection left
    to the garbage collector is a ResourceWarning (an error here) in whichever test runs then."""
    yield
    while _made:
        app, db = _made.pop()
        with app.app_context():
            db.engine.dispose()


def _host(geneva_database, **config):
    app = Flask("host")
    app.config.update(
        SECRET_KEY="host-secret-key-long-enough-0c9e", **geneva_database.flask_config(), **config
    )
    db = SQLAlchemy()
    db.init_app(app)
    _made.append((app, db))
    return app, db


def test_init_app_needs_the_hosts_flask_sqlalchemy(geneva_database):
    app, _db = _host(geneva_database)
    with pytest.raises(ConfigurationError, match="Flask-SQLAlchemy"):
        GenevaDrive().init_app(app)


@pytest.mark.parametrize("prefix", ["admin", "/", "//x", ""])
def test_a_url_prefix_that_is_no_path_is_refused(geneva_database, prefix):
    app, db = _host(geneva_database, GENEVA_URL_PREFIX=prefix)
    with pytest.raises(ConfigurationError, match="GENEVA_URL_PREFIX"):
        GenevaDrive(app, db=db, url_prefix=prefix or None)


def test_the_prefix_comes_from_the_hosts_config(geneva_database, geneva_session):
    app, db = _host(geneva_database, GENEVA_URL_PREFIX="/ops/flows/")
    GenevaDrive(app, db=db, user_loader=lambda request: None)
    rules = {rule.rule for rule in app.url_map.iter_rules()}
    assert "/ops/flows/workflows" in rules and "/workflows" not in rules
    # Anonymous: the dashboard's own login, under the prefix (no host login view here).
    response = app.test_client().get("/ops/flows/workflows")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/ops/flows/login?next=")


def test_a_migrate_without_the_autogenerate_filter_is_warned_about(geneva_database, caplog):
    app, db = _host(geneva_database)
    Migrate(app, db)
    with caplog.at_level(logging.WARNING, logger="geneva_drive.dashboard.extension"):
        GenevaDrive(app, db=db)
    assert "include_object" in caplog.text

    caplog.clear()
    filtered, db2 = _host(geneva_database)
    Migrate(filtered, db2, include_object=exclude_engine_tables)
    with caplog.at_level(logging.WARNING, logger="geneva_drive.dashboard.extension"):
        GenevaDrive(filtered, db=db2)
    assert "include_object" not in caplog.text
