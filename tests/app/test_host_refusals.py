"""A host user the dashboard refuses (no role, or a role it does not know) is recorded in the
audit log under the host's stable id, in the same ``host:<id> <name>`` form as their allowed
actions (docs/MANUAL.md, "Security"), never as ``anonymous``.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select

from geneva_drive.dashboard import GenevaDrive
from geneva_drive.models import OperatorAction

SECRET_KEY = "host-secret-key-long-enough-0c9e"


class HostUser:
    def __init__(self, user_id: int, name: str, role: str | None) -> None:
        self.id = user_id
        self.name = name
        self.geneva_drive_role = role
        self.is_authenticated = True
        self.is_active = True
        self.is_anonymous = False

    def get_id(self) -> str:
        return str(self.id)


@pytest.fixture
def host(geneva_database, geneva_session, monkeypatch):
    """``host(users)``: a Flask-Login host with the dashboard at /admin."""
    from flask_login import LoginManager, login_user

    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")
    made: list[tuple[Flask, SQLAlchemy]] = []

    def make(users: dict[int, HostUser], **options: Any) -> Flask:
        app = Flask("host")
        app.config.update(
            SECRET_KEY=SECRET_KEY, GENEVA_URL_PREFIX="/admin", **geneva_database.flask_config()
        )
        db = SQLAlchemy()
        db.init_app(app)
        manager = LoginManager()
        manager.init_app(app)
        manager.user_loader(lambda user_id: users.get(int(user_id)))

        @app.post("/host-login/<int:user_id>")
        def host_login(user_id: int) -> tuple[str, int]:
            login_user(users[user_id])
            return "", 204

        GenevaDrive(app, db=db, **options)
        made.append((app, db))
        return app

    yield make
    for app, db in made:
        with app.app_context():
            db.engine.dispose()


def _refusals(geneva_session) -> list[tuple[str, str]]:
    geneva_session.expire_all()
    rows = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.action == "refused_request")
    ).all()
    return [(row.actor, row.result) for row in rows]


@pytest.mark.parametrize("role", [None, "admin"])
def test_a_host_user_refused_by_role_is_audited_under_their_id(host, geneva_session, role):
    app = host({7: HostUser(7, "mallory", role)})
    client = app.test_client()
    client.post("/host-login/7")
    assert client.get("/admin/workflows").status_code == 403
    rows = _refusals(geneva_session)
    assert rows == [("host:7 mallory", "forbidden")], rows


def test_the_refused_actor_uses_the_hosts_name_hook(host, geneva_session):
    app = host(
        {7: HostUser(7, "cli:root", None)},
        actor_name=lambda user: f"Mallory <m@shop.test>#{user.get_id()}",
    )
    client = app.test_client()
    client.post("/host-login/7")
    assert client.get("/admin/workflows").status_code == 403
    rows = _refusals(geneva_session)
    assert rows == [("host:7 Mallory <m@shop.test>#7", "forbidden")], rows


def test_a_stranger_is_still_anonymous(host, geneva_session):
    """Nobody signed in: nothing to refuse by role (the host's login page), no host actor."""
    app = host({})
    response = app.test_client().get("/admin/workflows/1/pause")
    assert response.status_code in (302, 401, 404, 405)
    assert all(not actor.startswith("host:") for actor, _ in _refusals(geneva_session))
