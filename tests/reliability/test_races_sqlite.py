"""The embedded default under concurrency: SQLite, several threads, each its own session.

SQLite has no row locks; the executor's lock sections hold the database write lock
(BEGIN IMMEDIATE), so the same guarantees must hold by serialization.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import timedelta

from sqlalchemy import func, select

from geneva_drive import Workflow, executor, step
from geneva_drive.dispatch import dispatch_due
from geneva_drive.errors import DuplicateWorkflowError, InvalidStateError
from geneva_drive.models import utcnow
from tests.conftest import Order
from tests.reliability.harness import (
    Ledger,
    act,
    current_execution_id,
    drain,
    new_order_id,
    new_workflow,
    requires_sqlite,
    session_scope,
    storm,
    workflow_state,
)
from tests.reliability.invariants import assert_invariants

pytestmark = requires_sqlite

LEDGER = Ledger()


class RaceLiteOnce(Workflow):
    @step
    def one(self):
        LEDGER.record(self.id, "one")
        time.sleep(random.uniform(0, 0.003))

    @step
    def two(self):
        LEDGER.record(self.id, "two")


class RaceLiteLater(Workflow):
    @step(wait=timedelta(hours=1))
    def later(self):
        LEDGER.record(self.id, "later")


def test_same_execution_executed_by_several_threads_runs_once(rdb):
    LEDGER.clear()
    for _ in range(10):
        workflow_id = new_workflow(RaceLiteOnce)
        execution_id = current_execution_id(workflow_id)
        result = storm([lambda e=execution_id: executor.execute(e)] * 6)
        assert result.unexpected() == []
        assert LEDGER.count(workflow_id, "one") == 1
        assert_invariants(rdb)
    drain()
    assert_invariants(rdb, quiescent=True)


def test_concurrent_create_for_one_hero(rdb):
    for _ in range(5):
        order_id = new_order_id()

        def create(order_id=order_id):
            with session_scope() as session:
                return RaceLiteOnce.create(hero=session.get(Order, order_id), session=session).id

        result = storm([create] * 5)
        assert result.unexpected(DuplicateWorkflowError) == []
        assert len(result.results) == 1
        with session_scope() as session:
            assert (
                session.scalar(
                    select(func.count())
                    .select_from(Workflow)
                    .where(Workflow.hero_id == str(order_id))
                )
                == 1
            )
    assert_invariants(rdb)


def test_two_dispatchers_send_each_execution_once(rdb, geneva_transport):
    ids = {current_execution_id(new_workflow(RaceLiteLater)) for _ in range(30)}
    geneva_transport.clear()
    moment = utcnow() + timedelta(hours=2)
    result = storm([lambda: dispatch_due(moment, batch_size=4)] * 3)
    assert result.unexpected() == []
    sent = Counter(geneva_transport.execution_ids)
    assert set(sent) == ids and max(sent.values()) == 1, sent
    assert_invariants(rdb)


def test_pause_and_resume_racing_the_step(rdb):
    LEDGER.clear()
    workflow_ids = []
    for _ in range(10):
        workflow_id = new_workflow(RaceLiteOnce)
        workflow_ids.append(workflow_id)
        execution_id = current_execution_id(workflow_id)

        def operator(workflow_id=workflow_id):
            time.sleep(random.uniform(0, 0.004))
            act(workflow_id, "pause")
            act(workflow_id, "resume")

        result = storm([lambda e=execution_id: executor.execute(e), operator])
        assert result.unexpected(InvalidStateError) == []
        assert_invariants(rdb)
    drain()
    for workflow_id in workflow_ids:
        assert workflow_state(workflow_id) == "finished"
        assert LEDGER.count(workflow_id, "two") == 1
    assert_invariants(rdb, quiescent=True)
