"""Simulated work inside demo steps: a short sleep, so the dashboard shows steps running."""

from __future__ import annotations

import random
import time

#: Seconds a demo step body sleeps (0 while seeding, so seeding stays fast).
LATENCY = (0.02, 0.25)
enabled = True


def work() -> None:
    if enabled:
        time.sleep(random.uniform(*LATENCY))
