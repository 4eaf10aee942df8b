"""Fixtures of the dashboard tests: an app on the test database, users, clients, workflows.

The app is built on the same database as ``geneva_session`` (the SQLite file, or the
PostgreSQL schema through ``search_path``), so rows committed by a test are what the pages
show, and what the dashboard commits is what the test reads back.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, ClassVar

import pytest
from werkzeug.security import generate_password_hash

from geneva_drive import Workflow, removed_step, step
from geneva_drive.dashboard import create_app
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import make_order

CSRF = "test-csrf-token"
# pbkdf2 with few rounds: the default scrypt costs ~50 ms per login, for nothing in tests.
_FAST = "pbkdf2:sha256:1000"
USERS = {
    "olga": {"password_hash": generate_password_hash("olga-pw", method=_FAST), "role": "operator"},
    "vic": {"password_hash": generate_password_hash("vic-pw", method=_FAST), "role": "viewer"},
}


class DashPayment(Workflow):
    """authorize → (gravestone legacy_capture) → charge (fails while ``fail_charge``) →
    confirm (parks for ``payment_confirmed``) → ship."""

    fail_charge: ClassVar[bool] = True

    @step
    def authorize(self) -> None:
        pass

    legacy_capture = removed_step()

    @step
    def charge(self) -> None:
        if DashPayment.fail_charge:
            raise RuntimeError("card declined <script>alert(1)</script>")

    @step(wait_for="payment_confirmed")
    def confirm(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


def app_config(database: Any, **extra: Any) -> dict[str, Any]:
    """create_app() configuration pointing at the test database."""
    config: dict[str, Any] = {
        "TESTING": True,
        "SECRET_KEY": "test-secret",
        "SQLALCHEMY_DATABASE_URI": database.url,
        "USERS": USERS,
        "COUNTS_CACHE_SECONDS": 0,
    }
    if database.schema is not None:
        config["SQLALCHEMY_ENGINE_OPTIONS"] = {
            "connect_args": {"options": f"-csearch_path={database.schema}"}
        }
    config.update(extra)
    return config


@pytest.fixture
def app_factory(geneva_database, geneva_session):  # type: ignore[no-untyped-def]
    """``app_factory(**config)``: a dashboard on the test database with extra configuration."""
    DashPayment.fail_charge = True
    built = []

    def build(**extra: Any) -> Any:
        flask_app = create_app(app_config(geneva_database, **extra))
        built.append(flask_app)
        return flask_app

    yield build
    for flask_app in built:
        with flask_app.app_context():
            from geneva_drive.dashboard.extensions import db

            db.session.remove()
            db.engine.dispose()


@pytest.fixture
def app(app_factory):  # type: ignore[no-untyped-def]
    return app_factory()


def login(client: Any, name: str) -> Any:
    """``client`` signed in as ``name``: the session a real login makes (the login time bounds
    its lifetime; the generation is the user's before any logout; the fingerprint is the one
    of the user's configured password hash)."""
    from geneva_drive.dashboard.auth import password_fingerprint

    with client.application.app_context():
        fingerprint = password_fingerprint(name)
    with client.session_transaction() as session:
        session["geneva_drive.user"] = name
        session["geneva_drive.iat"] = int(time.time())
        session["geneva_drive.gen"] = 0
        session["geneva_drive.pwd"] = fingerprint
        session["geneva_drive.csrf"] = CSRF
    return client


@pytest.fixture
def operator_client(app):  # type: ignore[no-untyped-def]
    return login(app.test_client(), "olga")


@pytest.fixture
def viewer_client(app):  # type: ignore[no-untyped-def]
    return login(app.test_client(), "vic")


@pytest.fixture
def make_workflow(geneva_session):  # type: ignore[no-untyped-def]
    """``make_workflow(run=True)``: a committed DashPayment on a new Order.

    With ``run=True`` it is speedrun until charge fails, so it ends paused with an error.
    """

    def make(run: bool = False) -> DashPayment:
        order = make_order(geneva_session)
        workflow = DashPayment.create(hero=order, session=geneva_session)
        geneva_session.commit()
        if run:
            with contextlib.suppress(RuntimeError):
                speedrun_workflow(workflow)
        return workflow

    return make


def post(client: Any, url: str, data: dict[str, Any] | None = None, htmx: bool = False) -> Any:
    headers = {"X-CSRF-Token": CSRF}
    if htmx:
        headers["HX-Request"] = "true"
    return client.post(url, data=data or {}, headers=headers)


def run_to_finish(workflow: DashPayment) -> None:
    """Let charge succeed, deliver the signal confirm waits for, and run to the end."""
    DashPayment.fail_charge = False
    with contextlib.suppress(RuntimeError):  # the helper refuses to drive a parked step
        speedrun_workflow(workflow)
    workflow.signal("payment_confirmed")
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
