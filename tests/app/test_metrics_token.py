"""``GENEVA_METRICS_TOKEN`` (docs/MANUAL.md, "Security"): a token too short to resist guessing
refuses to start, naming the setting; repeated wrong tokens from one client are answered 429
for a while, and the scraper holding the right token keeps scraping.
"""

from __future__ import annotations

from typing import Any

import pytest

from geneva_drive.errors import ConfigurationError

TOKEN = "metrics-token-8f1d3c2b7a"
ATTACKER = {"REMOTE_ADDR": "203.0.113.66"}
SCRAPER = {"REMOTE_ADDR": "192.0.2.10"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("token", ["x", "1", "short-token", "a" * 15])
def test_a_short_token_refuses_to_start(app_factory, token):
    with pytest.raises(ConfigurationError) as refused:
        app_factory(METRICS_TOKEN=token)
    message = str(refused.value)
    assert "GENEVA_METRICS_TOKEN" in message and "16" in message, message
    if len(token) > 2:  # never echoed
        assert token not in message, message


def test_a_short_token_from_the_environment_refuses_to_start(app_factory, monkeypatch):
    monkeypatch.setenv("GENEVA_METRICS_TOKEN", "7")  # JSON-parsed to an int by Flask
    with pytest.raises(ConfigurationError, match="GENEVA_METRICS_TOKEN"):
        app_factory()


def test_a_token_of_sixteen_characters_is_accepted(app_factory):
    app = app_factory(METRICS_TOKEN="0123456789abcdef")
    response = app.test_client().get("/metrics", headers=_bearer("0123456789abcdef"))
    assert response.status_code == 200


def _guess(client: Any, n: int, environ: dict[str, str] = ATTACKER) -> list[int]:
    return [
        client.get("/metrics", headers=_bearer(f"guess-{i}"), environ_base=environ).status_code
        for i in range(n)
    ]


def test_repeated_wrong_tokens_are_throttled(app_factory):
    app = app_factory(METRICS_TOKEN=TOKEN, METRICS_MAX_FAILURES=5)
    client = app.test_client()
    codes = _guess(client, 8)
    assert codes[:5] == [401] * 5, codes
    assert codes[5:] == [429] * 3, codes
    blocked = client.get("/metrics", headers=_bearer("guess-x"), environ_base=ATTACKER)
    assert int(blocked.headers["Retry-After"]) >= 1
    # While it waits, the token is not even compared: a right guess gains nothing either.
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=ATTACKER).status_code == 429


def test_the_right_token_keeps_working(app_factory):
    app = app_factory(METRICS_TOKEN=TOKEN, METRICS_MAX_FAILURES=5)
    client = app.test_client()
    shared = {"REMOTE_ADDR": "198.51.100.7"}  # a proxy both the scraper and a guesser are behind
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=shared).status_code == 200
    assert 429 in _guess(client, 8)
    _guess(client, 8, shared)  # not throttled there: the token's length is what stands
    # The scraper elsewhere, and the one that scraped from the shared address, go on.
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=SCRAPER).status_code == 200
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=shared).status_code == 200


def test_the_throttle_ends(app_factory):
    from geneva_drive.dashboard import metrics

    now = [1000.0]
    app = app_factory(METRICS_TOKEN=TOKEN, METRICS_MAX_FAILURES=3)
    app.extensions[metrics.THROTTLE_KEY].clock = lambda: now[0]
    client = app.test_client()
    assert _guess(client, 4)[-1] == 429
    now[0] += 3600
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=ATTACKER).status_code == 200


def test_a_missing_token_is_not_counted_as_a_guess(app_factory):
    app = app_factory(METRICS_TOKEN=TOKEN, METRICS_MAX_FAILURES=3)
    client = app.test_client()
    for _ in range(10):
        assert client.get("/metrics", environ_base=SCRAPER).status_code == 401
    assert client.get("/metrics", headers=_bearer(TOKEN), environ_base=SCRAPER).status_code == 200
