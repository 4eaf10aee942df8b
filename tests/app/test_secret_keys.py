"""The secret key rules (docs/MANUAL.md, "Security"): keys published in tutorials and keys too
predictable to sign sessions are refused, by the standalone dashboard and under a host app, with
a message that names the setting and says how to make a good key; real random keys pass.
"""

from __future__ import annotations

import os
import secrets
import uuid
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from geneva_drive.dashboard import GenevaDrive, create_app
from geneva_drive.dashboard import config as dashboard_config
from geneva_drive.errors import ConfigurationError
from tests.app.conftest import app_config

#: Keys printed in Flask's and well-known tutorials' pages: whoever read them can sign sessions.
PUBLISHED = [
    b'_5#y2L"F4Q8z\n\xec]/',  # Flask's quickstart, as bytes
    '_5#y2L"F4Q8z\n\xec]/',  # ... and as the text it prints
    '_5#y2L"F4Q8z\\n\\xec]/',  # ... and copied with its escapes into an environment variable
    "b'_5#y2L\"F4Q8z\\n\\xec]/'",  # ... quotes and all
    "192b9bdd22ab9ed4d12e236c78afcb9a393ec15f71bbf5dc987d54727823bcbf",  # Flask's token_hex()
    "A0Zr98j/3yX R~XHH!jmN]LWX/,?RT",  # Flask's early sessions example
    "dev",  # Flask's tutorial
    "you-will-never-guess",  # the Flask Mega-Tutorial
    "You will never guess",
    "hard to guess string",  # Flask Web Development
    "development key",
    "super secret key",
]

#: Long enough, and still guessable: repeated or patterned characters.
PREDICTABLE = [
    "a" * 32,
    "0" * 64,
    "ab" * 16,
    "abcdefghijklmnopqrstuvwxyz",
    "0123456789abcdef" * 2,
    "a" * 31 + "b",
    "a" * 20 + "b" * 20,
    "passwordpassword",
    "password12345678",
    "abcabcabcabcabcabcabcx",
]


@pytest.mark.parametrize("key", PUBLISHED, ids=repr)
def test_published_keys_are_refused(key):
    problem = dashboard_config.secret_key_problem(key)
    assert problem is not None and "published" in problem, (key, problem)
    assert "GENEVA_SECRET_KEY" in problem


@pytest.mark.parametrize("key", PREDICTABLE)
def test_predictable_keys_are_refused(key):
    problem = dashboard_config.secret_key_problem(key)
    assert problem is not None, key
    assert "GENEVA_SECRET_KEY" in problem and "bits" in problem, problem


@pytest.mark.parametrize(
    "make",
    [
        lambda: secrets.token_urlsafe(32),
        lambda: secrets.token_urlsafe(16),
        lambda: secrets.token_hex(32),
        lambda: secrets.token_hex(16),
        lambda: uuid.uuid4().hex,
        lambda: os.urandom(24),
        lambda: os.urandom(16),
    ],
    ids=[
        "token_urlsafe32",
        "token_urlsafe16",
        "token_hex32",
        "token_hex16",
        "uuid4",
        "urandom24",
        "urandom16",
    ],
)
def test_random_keys_pass(make):
    for _ in range(300):
        key = make()
        assert dashboard_config.secret_key_problem(key) is None, key


@pytest.mark.parametrize(
    "key",
    [
        "secret-key-0c9e77a1-long-enough",
        "host-secret-key-long-enough-0c9e",
        "a-host-key-long-and-random-enough-0123456789",
    ],
)
def test_long_mixed_keys_pass(key):
    assert dashboard_config.secret_key_problem(key) is None


def _bare_config(geneva_database: Any, key: Any) -> dict[str, Any]:
    config = app_config(geneva_database, SECRET_KEY=key)
    config.pop("TESTING")
    return config


@pytest.mark.parametrize("key", ["you-will-never-guess", "a" * 40, b'_5#y2L"F4Q8z\n\xec]/'])
def test_the_dashboard_refuses_to_start_with_such_a_key(geneva_database, key):
    with pytest.raises(ConfigurationError) as refused:
        create_app(_bare_config(geneva_database, key))
    message = str(refused.value)
    assert "GENEVA_SECRET_KEY" in message and "secrets.token_urlsafe" in message, message


@pytest.mark.parametrize("key", ["dev", "you-will-never-guess", "x" * 48])
def test_a_host_app_with_such_a_key_is_refused(geneva_database, monkeypatch, key):
    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")
    app = Flask("host")
    app.config.update(SECRET_KEY=key, **geneva_database.flask_config())
    db = SQLAlchemy()
    db.init_app(app)
    try:
        with pytest.raises(ConfigurationError) as refused:
            GenevaDrive(app, db=db)
        message = str(refused.value)
        assert "SECRET_KEY" in message and "token_urlsafe" in message, message
    finally:
        with app.app_context():
            db.engine.dispose()
