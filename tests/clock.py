"""A held clock for tests whose assertions depend on "now" (the ``frozen_clock`` fixture).

The engine and the dashboard read the time through one function, ``geneva_drive.models.utcnow``,
which each module imports by name. ``FrozenClock`` replaces that name in every loaded
``geneva_drive`` module (and in ``models``, so a module imported later gets it too) with a
clock that moves only when the test moves it. A line such as "due now" or a count of overdue
rows then reads one instant, however long a loaded machine takes between two reads.

Column defaults (``default=utcnow`` on the models) keep the real clock: they were bound when
the models were defined. Rows a test creates get real ``created_at`` stamps; what the engine
decides (``scheduled_for``, ``transitioned_at``, lateness) follows the held clock.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

import pytest

from geneva_drive import models


class FrozenClock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: datetime | None = None) -> None:
        self.now = at if at is not None else models.utcnow()
        real = models.utcnow
        for name, module in list(sys.modules.items()):
            if name.startswith("geneva_drive") and getattr(module, "utcnow", None) is real:
                monkeypatch.setattr(module, "utcnow", self)

    def __call__(self) -> datetime:
        return self.now

    def set(self, at: datetime) -> datetime:
        self.now = at
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now += delta
        return self.now
