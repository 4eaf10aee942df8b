"""Workflows of the worker-liveness fleet test (tests/integration/test_worker_liveness_fleet.py).

Imported by its workers through ``GENEVA_WORKFLOW_MODULES=tests.integration.liveness_flows``.
Step bodies append ``<workflow id> <step> <event> <pid>`` lines to ``GENEVA_TEST_LOG``
(tests/integration/flows.py's ``record``): how many times a body started, and in which process.

``LvHangWorkflow.hang`` also writes a row to ``lv_ledger`` through ``self.session``, the step's
own transaction, before it blocks: a run killed mid-step leaves that row uncommitted, so the
ledger holds exactly one row per workflow when no write was lost or doubled (docs/MANUAL.md,
"When a worker dies").
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, insert

from geneva_drive import Workflow, step
from tests.integration.flows import record

#: The ledger's own metadata: not the engine's Base, so the suite's databases do not get it.
ledger_metadata = MetaData()
ledger = Table(
    "lv_ledger",
    ledger_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("workflow_id", BigInteger, nullable=False),
    Column("step", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
)

#: How long a parked ``LvDeadlineWorkflow`` waits before its time-out cancels it.
DEADLINE = timedelta(seconds=8)


class LvHangWorkflow(Workflow):
    """``hang`` blocks on its first run (a marker file next to the log says it happened) until
    the test kills its process; the rerun finishes at once. ``after`` shows the workflow went on."""

    may_proceed_without_hero = True

    @step
    def hang(self) -> None:
        self.session.execute(
            insert(ledger).values(workflow_id=self.id, step="hang", pid=os.getpid())
        )
        record(self, "hang", "start")
        marker = Path(os.environ["GENEVA_TEST_LOG"] + f".hang-{self.id}")
        if not marker.exists():
            marker.touch()
            time.sleep(300)
        record(self, "hang", "end")

    @step
    def after(self) -> None:
        record(self, "after")


class LvDeadlineWorkflow(Workflow):
    """Parks for a signal no one sends; its time-out cancels it ``DEADLINE`` after it parked."""

    may_proceed_without_hero = True

    @step(wait_for="never_sent", timeout=DEADLINE, on_timeout="cancel")
    def wait_here(self) -> None:
        record(self, "wait_here")


class LvBacklogWorkflow(Workflow):
    """One slowish step: hundreds of these keep a one-process worker's queue full."""

    may_proceed_without_hero = True

    @step
    def chew(self) -> None:
        time.sleep(0.2)
