"""The shop's test setup: GenevaDrive's pytest plugin (installed with geneva-drive) builds a
fresh database per test holding the engine's tables *and* the shop's (``geneva_metadata``),
and ``flask_config()`` points the shop's Flask-SQLAlchemy at it."""

from __future__ import annotations

import secrets

import pytest
from app.models import User

from app import create_app, db


@pytest.fixture
def geneva_metadata():
    return db.metadata  # the shop's tables, created beside the engine's in each test database


@pytest.fixture
def shop(geneva_database):
    app = create_app(
        {"TESTING": True, "SECRET_KEY": secrets.token_urlsafe(32), **geneva_database.flask_config()}
    )
    with app.app_context():
        for name, role in (("alice", "operator"), ("bob", None)):
            user = User(name=name, geneva_drive_role=role)
            user.set_password(f"{name}-pw")
            db.session.add(user)
        db.session.commit()
    yield app
    with app.app_context():
        db.engine.dispose()


def sign_in(client, name):
    response = client.post("/login", data={"name": name, "password": f"{name}-pw"})
    assert response.status_code == 302, response.text
