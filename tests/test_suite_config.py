"""The suite's own rules: every test runs under a time limit (pytest-timeout),
``sqlite_pass`` tests are left to the SQLite pass, and the longest files are collected first."""

from __future__ import annotations

from pathlib import Path

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


def test_the_files_started_first_exist_and_are_collected_first(
    request: pytest.FixtureRequest,
) -> None:
    """A renamed file left in ``START_FIRST`` would silently go back to being started last."""
    from tests.conftest import START_FIRST

    root = Path(request.config.rootpath)
    assert [path for path in START_FIRST if not (root / path).is_file()] == []
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in request.session.items))
    first = [path for path in START_FIRST if path in files]  # a run of some files has some
    assert files[: len(first)] == first
