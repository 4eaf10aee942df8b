"""A request for a ``Host`` outside ``GENEVA_TRUSTED_HOSTS`` (docs/MANUAL.md, "Security") is
answered 400 with the minimal error page and logged in one line: no traceback per request, so
a flood of them cannot flood the log.
"""

from __future__ import annotations

import logging

import pytest

HOSTILE = "rebind.attacker.test\x1b[2J\x08\x08INFO forged"


@pytest.mark.parametrize("path", ["/workflows", "/healthz", "/no-such-page", "/static/x.css"])
@pytest.mark.parametrize("htmx", [False, True])
def test_an_untrusted_host_gets_the_minimal_page_and_one_log_line(
    app_factory, monkeypatch, caplog, path, htmx
):
    monkeypatch.setenv("GENEVA_TRUSTED_HOSTS", "dash.example.com")
    app = app_factory()
    client = app.test_client()
    headers = {"Host": "rebind.attacker.test"}
    if htmx:
        headers["HX-Request"] = "true"
    with caplog.at_level(logging.DEBUG):
        response = client.get(path, headers=headers)
    assert response.status_code == 400
    body = response.get_data(as_text=True)
    assert "400" in body and "rebind.attacker.test" not in body, body
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(records) == 1, [(r.name, r.getMessage()[:120]) for r in records]
    (record,) = records
    assert record.exc_info is None and not record.exc_text, record.getMessage()
    message = record.getMessage()
    assert "\n" not in message and "rebind.attacker.test" in message, message


def test_a_forged_host_cannot_forge_log_lines(app_factory, monkeypatch, caplog):
    monkeypatch.setenv("GENEVA_TRUSTED_HOSTS", "dash.example.com")
    app = app_factory()
    with caplog.at_level(logging.DEBUG):
        response = app.test_client().get("/workflows", headers={"Host": HOSTILE})
    assert response.status_code == 400
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(messages) == 1 and messages[0].isprintable(), messages


def test_a_trusted_host_is_still_served(app_factory, monkeypatch):
    monkeypatch.setenv("GENEVA_TRUSTED_HOSTS", "dash.example.com")
    app = app_factory()
    assert (
        app.test_client().get("/healthz", headers={"Host": "dash.example.com"}).status_code == 200
    )
