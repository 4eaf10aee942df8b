"""Two real ``geneva-drive dispatcher`` processes fire one schedule: each tick creates one
workflow, whichever process got to it (docs/MANUAL.md, "Recurring work")."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import ScheduleRow
from geneva_drive.workflow import Workflow
from tests.integration.conftest import (
    BIN,
    REDIS_URL,
    Process,
    SharedDatabase,
    process_env,
    require_service,
    wait_until,
)

pytestmark = pytest.mark.integration


def _ticks() -> list[str]:
    with db.new_session() as session:
        rows = session.execute(
            select(Workflow.metadata_).where(Workflow.type == "EverySecond")
        ).scalars()
        return [row["tick"] for row in rows]


def test_two_dispatcher_processes_fire_each_tick_once(
    shared_database: SharedDatabase, tmp_path: Path, processes: list[Process]
) -> None:
    require_service("Redis", REDIS_URL)
    env = process_env(
        shared_database,
        tmp_path / "steps.log",
        GENEVA_WORKFLOW_MODULES="tests.integration.schedule_flows",
        GENEVA_BROKER_URL=REDIS_URL,
        # Messages of the created workflows' first steps go to a queue of this test's own.
        GENEVA_DEFAULT_QUEUE=f"sched-{uuid.uuid4().hex[:8]}",
    )
    dispatchers = [
        Process(
            [str(BIN / "geneva-drive"), "dispatcher", "--interval", "0.2", "--no-housekeeping"],
            env,
            tmp_path / f"dispatcher{n}.log",
        )
        for n in (1, 2)
    ]
    processes.extend(dispatchers)
    for dispatcher in dispatchers:
        dispatcher.wait_for_output("GenevaDrive dispatcher running", timeout=60)
    wait_until(lambda: len(_ticks()) >= 8, timeout=60, what="eight ticks fired")
    for dispatcher in dispatchers:
        assert dispatcher.stop() == 0
    ticks = _ticks()
    assert [tick for tick, n in Counter(ticks).items() if n > 1] == []  # none twice
    instants = sorted(datetime.fromisoformat(tick) for tick in ticks)
    gaps = {later - earlier for earlier, later in itertools.pairwise(instants)}
    assert gaps == {timedelta(seconds=1)}  # and none left out between the first and the last
    with db.new_session() as session:
        row = session.scalars(select(ScheduleRow).where(ScheduleRow.name == "EverySecond")).one()
    assert row.ticks_created == len(ticks)
    assert row.ticks_missed == row.ticks_skipped == 0
    time.sleep(1.5)  # both dispatchers stopped: nothing more is created
    assert len(_ticks()) == len(ticks)
