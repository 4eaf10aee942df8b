"""Example tests run the steps without the demo's simulated latency."""

from __future__ import annotations

import pytest

from geneva_drive.examples import _work


@pytest.fixture(autouse=True)
def _no_simulated_latency(monkeypatch):
    monkeypatch.setattr(_work, "enabled", False)
