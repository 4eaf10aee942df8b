"""Fan-out and join at scale (docs/MANUAL.md, "Fanning out to 10,000 children": a child costs
O(1), so 10,000 children of one parent are created in one step in seconds and joined without
rescanning them), on SQLite,
PostgreSQL and MariaDB.

10,000 children of one parent are started by one step and ended from four threads, each child
through the transitions and the ``scheduling.finish_workflow`` the executor's finalize takes:
the join runs exactly once, every counter exact. One child's end runs the same statements
with 10 siblings as with 1,000, and none of them reads the siblings.

A file of its own: pytest-xdist (``--dist loadfile``) runs it beside test_children.py.
"""

from __future__ import annotations

import re
import threading

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, scheduling, transitions
from geneva_drive import children as children_module
from geneva_drive.executor import execute
from geneva_drive.models import Signal, StepExecution
from geneva_drive.testing import speedrun_workflow
from tests.engine.child_fleet import joined, start_fleet
from tests.engine.helpers import executions, make_order, other_session
from tests.metrics.conftest import counting


def _end_in_batches(ids: list[int], *, threads: int, batch: int) -> None:
    """End the children ``ids`` finished, ``batch`` per transaction, from ``threads`` threads
    (each a worker on its own connection): each child as the executor ends a last step that
    ran (started, completed, then ``scheduling.finish_workflow``), so each end is reported to
    the parent on its own, under the parent's lock, the threads contending for it."""
    errors: list[BaseException] = []

    def end(share: list[int]) -> None:
        try:
            with other_session() as mine:
                for page in range(0, len(share), batch):
                    chunk = share[page : page + batch]
                    kids = list(
                        mine.scalars(
                            select(Workflow)
                            .where(Workflow.id.in_(chunk))
                            .order_by(Workflow.id)
                            .with_for_update()
                        )
                    )
                    current = {
                        e.workflow_id: e
                        for e in mine.scalars(
                            select(StepExecution).where(StepExecution.workflow_id.in_(chunk))
                        )
                    }
                    assert len(kids) == len(current) == len(chunk)
                    for child in kids:
                        execution = current[child.id]
                        transitions.start_execution(execution)
                        transitions.workflow_performing(child, execution.step_name)
                        transitions.complete_execution(execution)
                        scheduling.finish_workflow(mine, child, sweep=False)
                    mine.commit()
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=end, args=(ids[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors[:3]


def _assert_joined_once(session, transport, parent: Workflow, ids: list[int]) -> None:
    session.expire_all()
    assert (parent.children_open, parent.children_canceled) == (0, 0)
    join = executions(session, parent, "invoice")[-1]
    assert join.state == "scheduled"  # woken by the last end, once
    assert transport.execution_ids.count(join.id) == 1
    speedrun_workflow(parent)
    assert parent.state == "finished" and joined == [parent.id]
    assert [e.state for e in executions(session, parent, "invoice")] == ["completed"]
    reported = select(Signal.idempotency_key).where(
        Signal.workflow_id == parent.id, Signal.name == children_module.CHILD_ENDED
    )
    keys = list(session.scalars(reported))
    assert len(keys) == len(set(keys)) == len(ids)
    assert set(keys) == {str(i) for i in ids}
    states = session.scalars(select(Workflow.state).where(Workflow.parent_id == parent.id))
    assert set(states) == {"finished"}


# Measured 2026-12-02 on this 2-core machine (load 2-7): 61 s on SQLite, 370-465 s on
# PostgreSQL and 258 s on MariaDB, when each start updated the parent's counter and each end's
# statements were built by SQLAlchemy. Since 2026-12-03 (one counter UPDATE per step, the end's
# statements compiled once), alone on a quiet machine: 9 s on SQLite, 85 s on PostgreSQL, 31 s
# on MariaDB. Every end holds the parent's row lock until its transaction commits, so the four
# threads take turns at it (they test the contention, they cannot shorten it); batches of 250
# keep the commits few. The limit stays generous for a loaded machine.
@pytest.mark.timeout(1800)
def test_ten_thousand_children_are_joined_exactly_once(geneva_session, order, geneva_transport):
    parent, ids = start_fleet(geneva_session, order, 10_000)
    geneva_transport.clear()
    _end_in_batches(ids, threads=4, batch=250)
    _assert_joined_once(geneva_session, geneva_transport, parent, ids)


# --- O(1) per child: the statements of one end -----------------------------------------------


#: A statement that selects or filters workflows by their parent: a rescan of the siblings.
_BY_PARENT = re.compile(r"\bparent_id\s*(=|IN\b)", re.IGNORECASE)


def _ends_counted(session, engine, size: int) -> tuple[list[str], list[str]]:
    """The statements of a child's end (by the real executor) among ``size`` children: the
    first end (the join stays parked), then the last (it wakes the join)."""
    parent, ids = start_fleet(session, make_order(session), size)
    session.commit()
    first, last = (
        session.scalars(select(StepExecution.id).where(StepExecution.workflow_id == i)).one()
        for i in (ids[0], ids[-1])
    )
    with counting(engine) as counter:
        assert execute(first)
    first_end = counter.statements
    session.expire_all()
    assert parent.children_open == size - 1
    assert executions(session, parent, "invoice")[-1].state == "waiting"
    _end_in_batches(ids[1:-1], threads=1, batch=500)
    session.expire_all()
    assert parent.children_open == 1
    with counting(engine) as counter:
        assert execute(last)
    last_end = counter.statements
    session.expire_all()
    assert parent.children_open == 0
    assert executions(session, parent, "invoice")[-1].state == "scheduled"
    return first_end, last_end


@pytest.mark.timeout(600)
def test_a_childs_end_runs_the_same_statements_with_10_or_1000_siblings(
    geneva_session, geneva_database
):
    engine = geneva_database.engine
    few = _ends_counted(geneva_session, engine, 11)
    many = _ends_counted(geneva_session, engine, 1001)
    for with_10, with_1000 in zip(few, many, strict=True):
        assert len(with_10) == len(with_1000), (with_10, with_1000)
        rescans = [s for s in with_1000 if _BY_PARENT.search(s)]
        assert rescans == [], rescans


# --- the cost of a child's start -------------------------------------------------------------


#: ``_lock_parent``'s read: the parent's id, by its id (``FOR UPDATE`` on the servers).
_PARENT_LOCK = re.compile(
    r"^SELECT geneva_drive_workflows\.id\s+FROM geneva_drive_workflows\s+"
    r"WHERE geneva_drive_workflows\.id = \S+( FOR UPDATE)?\s*$"
)


def _started_counted(session, engine, size: int) -> list[str]:
    with counting(engine) as counter:
        start_fleet(session, make_order(session), size)
    return counter.statements


def test_a_childs_start_runs_two_statements_and_no_savepoint(geneva_session, geneva_database):
    """Each ``start_child`` (``allow_multiple=True``, so no unique key can collide) runs the
    child's INSERT and its first execution's INSERT: no SAVEPOINT around the insert (two round
    trips per child on the servers), and no UPDATE of the parent's counter, which gets all of
    the step's children in one UPDATE at its commit. The parent's row is locked once, before
    the first child."""
    engine = geneva_database.engine
    ten = _started_counted(geneva_session, engine, 10)
    thirty = _started_counted(geneva_session, engine, 30)
    assert (len(thirty) - len(ten)) == 2 * 20, thirty
    counters = [s for s in thirty if re.search(r"SET children_open\s*=", s)]
    assert len(counters) == 1, counters
    parent_locks = [s for s in thirty if _PARENT_LOCK.search(s)]
    assert len(parent_locks) == 1, parent_locks

    def savepoints(statements: list[str]) -> list[str]:
        return [s for s in statements if s.lstrip().upper().startswith(("SAVEPOINT", "RELEASE"))]

    # The parent's own create() (one per hero) keeps its savepoint; its children take none.
    assert savepoints(thirty) == savepoints(ten) != []
