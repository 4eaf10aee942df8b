"""Two processes create the same workflow for one hero at the same moment (PostgreSQL and
MariaDB): exactly one wins, the other gets DuplicateWorkflowError from the unique index (the
partial index on PostgreSQL, the generated-column index on MariaDB/MySQL)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, db, step
from geneva_drive.errors import DuplicateWorkflowError
from tests.backends import SERVER_ONLY_REASON, connection_id, on_server_database, waits_on_a_lock
from tests.conftest import Order
from tests.engine.helpers import make_order

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not on_server_database(), reason=SERVER_ONLY_REASON),
]


class RaceWorkflow(Workflow):
    @step
    def only(self):
        pass


def _create_in_own_session(order_id, results, name, before_commit=None, pids=None):
    session = db.new_session()
    try:
        if pids is not None:
            pids[name] = connection_id(session)
        hero = session.get(Order, order_id)
        wf = RaceWorkflow.create(hero=hero, session=session)
        if before_commit is not None:
            before_commit()
        session.commit()
        results[name] = ("ok", wf.id)
    except DuplicateWorkflowError as exc:
        session.rollback()
        results[name] = ("duplicate", exc)
    except Exception as exc:  # pragma: no cover - reported by the assertion below
        session.rollback()
        results[name] = ("error", exc)
    finally:
        session.close()


def _wait_until_blocked_on_a_lock(pid, timeout=20.0):
    """Poll the server until connection ``pid`` waits on a lock (the unique index entry)."""
    deadline = time.monotonic() + timeout
    with db.new_session() as monitor:
        while time.monotonic() < deadline:
            waiting = waits_on_a_lock(monitor, pid)
            monitor.rollback()
            if waiting:
                return True
            time.sleep(0.02)
    return False


def test_two_threads_race_to_create_exactly_one_wins(geneva_session):
    order = make_order(geneva_session)
    geneva_session.commit()
    barrier = threading.Barrier(2)
    results: dict[str, tuple] = {}

    def run(name):
        barrier.wait(timeout=10)
        _create_in_own_session(order.id, results, name)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    outcomes = sorted(r[0] for r in results.values())
    assert outcomes == ["duplicate", "ok"], results
    geneva_session.expire_all()
    rows = geneva_session.scalars(select(Workflow).where(Workflow.hero_id == str(order.id))).all()
    assert len(rows) == 1 and rows[0].state == "ready"
    assert len(rows[0].step_executions) == 1


def test_index_decides_when_the_validation_cannot_see_the_other_insert(geneva_session):
    """B validates while A's row is inserted but uncommitted: B blocks on the unique index
    until A commits, then gets DuplicateWorkflowError (not a raw IntegrityError)."""
    order = make_order(geneva_session)
    geneva_session.commit()
    results: dict[str, tuple] = {}
    pids: dict[str, int] = {}
    a_inserted = threading.Event()
    b_started = threading.Event()
    blocked = []

    def a_hold():
        a_inserted.set()
        assert b_started.wait(timeout=10)
        # commit only once B is really waiting for our uncommitted index entry
        blocked.append(_wait_until_blocked_on_a_lock(pids_ready()))

    def pids_ready():
        deadline = time.monotonic() + 10
        while "b" not in pids and time.monotonic() < deadline:
            time.sleep(0.01)
        return pids["b"]

    def run_a():
        _create_in_own_session(order.id, results, "a", before_commit=a_hold)

    def run_b():
        assert a_inserted.wait(timeout=10)
        b_started.set()
        _create_in_own_session(order.id, results, "b", pids=pids)

    threads = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert blocked == [True], "B never blocked on A's index entry"
    assert results["a"][0] == "ok", results
    assert results["b"][0] == "duplicate", results
    error = results["b"][1]
    assert "(workflow #" not in str(error)  # the index, not the validation query
    assert "already exists for Order" in str(error)
