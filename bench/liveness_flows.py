"""Workflows of bench/liveness_recovery.py, imported by its workers through
``GENEVA_WORKFLOW_MODULES=bench.liveness_flows`` and by the bench itself.

``GENEVA_BENCH_LV_DIR`` is the run's directory (marker files). The parked workflows' first step
goes to ``PARK_QUEUE`` (a worker of its own parks them while the main queue holds the backlog);
the queue names are fixed, the bench's Redis is its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from geneva_drive import Workflow, step

#: Seconds a parked ``BenchLvDeadline`` waits before its time-out cancels it.
DEADLINE_S = 20
PARK_QUEUE = "gd-bench-lv-park"


class BenchLvHang(Workflow):
    """``hang`` blocks on its first run until the bench SIGKILLs its process; the rerun ends at
    once (a marker file in ``GENEVA_BENCH_LV_DIR`` says the first run happened)."""

    may_proceed_without_hero = True

    @step
    def hang(self) -> None:
        marker = Path(os.environ["GENEVA_BENCH_LV_DIR"]) / f"hang-{self.id}"
        if not marker.exists():
            marker.touch()
            time.sleep(600)


class BenchLvDeadline(Workflow):
    """Parks for a signal no one sends; its time-out cancels it ``DEADLINE_S`` later."""

    may_proceed_without_hero = True

    @step(
        wait_for="never_sent",
        timeout=DEADLINE_S,
        on_timeout="cancel",
        job_options={"queue": PARK_QUEUE},
    )
    def wait_here(self) -> None:
        pass


class BenchLvBacklog(Workflow):
    """One slow step: ten thousand of these are the backlog in the main queue."""

    may_proceed_without_hero = True

    @step
    def chew(self) -> None:
        time.sleep(0.5)
