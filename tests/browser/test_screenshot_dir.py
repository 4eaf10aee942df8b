"""The browser suite writes the README's screenshots only when asked (GENEVA_SCREENSHOTS_RECORD)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import DOCS_SCREENSHOTS, screenshots_dir


def test_a_plain_run_leaves_the_committed_screenshots_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GENEVA_SCREENSHOTS_RECORD", raising=False)
    assert screenshots_dir() != DOCS_SCREENSHOTS
    assert DOCS_SCREENSHOTS not in screenshots_dir().parents


def test_record_writes_the_readmes_screenshots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENEVA_SCREENSHOTS_RECORD", "1")
    assert screenshots_dir() == DOCS_SCREENSHOTS
