"""The suite's own rules: every test runs under a time limit (pytest-timeout), and
``sqlite_pass`` tests are left to the SQLite pass."""

from __future__ import annotations

import pytest

from tests.backends import url_backend

pytestmark = pytest.mark.sqlite_pass  # checks the configuration, not a database


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert float(request.config.getini("timeout")) > 0  # the default: pyproject's `timeout`


def test_no_test_turns_its_time_limit_off(request: pytest.FixtureRequest) -> None:
    """A ``@pytest.mark.timeout`` may lengthen a test's limit, never remove it (0 or None
    would let a hung test hold CI), and no command line may switch the limit off."""
    option = request.config.getoption("timeout", None)
    assert option is None or float(option) > 0, f"--timeout={option} turns the limits off"
    unlimited = []
    for item in request.session.items:
        marker = item.get_closest_marker("timeout")
        if marker is None:
            continue
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is None or float(value) <= 0:
            unlimited.append(item.nodeid)
    assert unlimited == [], f"tests without a time limit: {unlimited}"


def test_the_server_passes_skip_sqlite_pass_tests(request: pytest.FixtureRequest) -> None:
    # This test is itself marked sqlite_pass: it only ever runs in the SQLite pass.
    assert url_backend() == "sqlite"
    assert request.node.get_closest_marker("sqlite_pass") is not None
