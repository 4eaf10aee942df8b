"""Fan-out and join: child workflows (docs/MANUAL.md, "Fan-out and join: child workflows"),
each rule through the public API and the
test helpers, on SQLite, PostgreSQL and MariaDB.

start_child creates the child in the step's transaction (a discarded attempt starts none) with
``create``'s rules; ``wait_for_children=True`` parks until every child started before it ended,
or runs at once; a canceled child triggers ``on_child_failure``; a paused child keeps the
parent waiting; ``cancel_children``; an operator pausing or canceling the parent; a join's
time-out; a child's end reaches its parent exactly once, counted, never by rescanning.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from geneva_drive import ConcurrencyLimit, Workflow, resumable_step, step
from geneva_drive import children as children_module
from geneva_drive.errors import (
    DuplicateWorkflowError,
    InvalidStateError,
    StepConfigurationError,
)
from geneva_drive.executor import execute
from geneva_drive.instrumentation import limit_deferred
from geneva_drive.models import Signal, StepExecution
from geneva_drive.testing import (
    expire_wait,
    perform_next_step,
    speedrun_children,
    speedrun_workflow,
)
from tests.backends import SERVER_ONLY_REASON, lock_waiters, on_server_database
from tests.engine.child_fleet import joined, start_fleet
from tests.engine.helpers import executions, make_order, other_session, summary

ran: list[str] = []


class KidLine(Workflow):
    @step
    def ship(self) -> None:
        ran.append(f"line {self.id}")


class KidSlowLine(Workflow):
    """Two steps, so a test can stop a child half-way."""

    @step
    def pick(self) -> None:
        pass

    @step
    def ship(self) -> None:
        ran.append(f"slow {self.id}")


def _parent_class(name: str, count: int = 3, **join: object) -> type[Workflow]:
    def ship(self: Workflow) -> None:
        for _ in range(count):
            self.start_child(KidLine, hero=self.hero, allow_multiple=True)

    def invoice(self: Workflow) -> None:
        ran.append("invoice")

    return type(
        name,
        (Workflow,),
        {
            "ship": step(ship),
            "invoice": step(wait_for_children=True, **join)(invoice),  # type: ignore[arg-type]
        },
    )


KidOrder = _parent_class("KidOrder")
KidOrderCancel = _parent_class("KidOrderCancel", on_child_failure="cancel")
KidOrderContinue = _parent_class("KidOrderContinue", on_child_failure="continue")
KidOrderTimeout = _parent_class("KidOrderTimeout", timeout=timedelta(hours=1), on_timeout="cancel")
KidOrderTimeoutRun = _parent_class(
    "KidOrderTimeoutRun", timeout=timedelta(hours=1), on_timeout="run"
)


class KidOrderCascade(Workflow):
    cancel_children = True

    @step
    def ship(self) -> None:
        for _ in range(2):
            self.start_child(KidSlowLine, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


class KidOrderFails(Workflow):
    @step(on_exception="pause")
    def ship(self) -> None:
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        raise RuntimeError("the warehouse is closed")

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


class KidOrderDuplicate(Workflow):
    @step
    def ship(self) -> None:
        self.start_child(KidLine, hero=self.hero)
        try:
            self.start_child(KidLine, hero=self.hero)  # one ongoing per hero
        except DuplicateWorkflowError:
            ran.append("duplicate refused")

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


@pytest.fixture(autouse=True)
def _clear_ran():
    ran.clear()
    yield
    ran.clear()


def _child_signals(session, parent) -> list[Signal]:
    session.expire_all()
    return list(
        session.scalars(
            select(Signal)
            .where(Signal.workflow_id == parent.id, Signal.name == children_module.CHILD_ENDED)
            .order_by(Signal.id)
        )
    )


def _join(session, parent) -> StepExecution:
    return executions(session, parent, "invoice")[-1]


# --- start_child and the relationships ---------------------------------------------------------


def test_the_join_parks_until_every_child_ended_then_runs(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)  # runs ship; the join parks; no child runs
    kids = parent.children
    assert [type(k) for k in kids] == [KidLine] * 3
    assert [k.id for k in kids] == sorted(k.id for k in kids)
    assert all(k.parent_id == parent.id and k.parent is parent for k in kids)
    assert {k.state for k in kids} == {"ready"}
    assert ran == []
    assert parent.state == "ready" and parent.children_open == 3
    assert _join(geneva_session, parent).state == "waiting"
    assert "waiting for 3 child workflows to end" in parent.why_waiting()

    speedrun_children(parent)
    assert sorted(ran) == sorted(f"line {k.id}" for k in kids)
    assert _join(geneva_session, parent).state == "scheduled"  # the last end woke it
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"
    assert summary(geneva_session, parent) == [
        ("ship", "completed", "success"),
        ("invoice", "completed", "success"),
    ]
    # One consumed child_ended signal per child, keyed by its id: the join's trail.
    signals = _child_signals(geneva_session, parent)
    assert sorted(s.idempotency_key for s in signals) == sorted(str(k.id) for k in kids)
    assert {s.state for s in signals} == {"consumed"}
    assert {s.payload["state"] for s in signals} == {"finished"}
    assert parent.children_open == 0


def test_the_join_runs_at_once_when_the_children_already_ended(geneva_session, order):
    parent = KidOrder.create(hero=order)
    perform_next_step(parent)  # ship
    speedrun_children(parent)  # every child ends before the parent reaches its join
    speedrun_workflow(parent)
    assert parent.state == "finished"
    join = _join(geneva_session, parent)
    assert join.state == "completed" and join.waiting_since is None
    assert ran[-1] == "invoice"


def test_a_step_without_children_joins_at_once(geneva_session, order):
    Lonely = _parent_class("KidLonely", count=0)
    parent = Lonely.create(hero=order)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran == ["invoice"]


def test_a_failed_attempt_starts_no_child(geneva_session, order):
    parent = KidOrderFails.create(hero=order)
    with pytest.raises(RuntimeError, match="warehouse"):
        speedrun_workflow(parent)
    assert parent.state == "paused"
    assert parent.children == []
    assert parent.children_open == 0
    count = geneva_session.scalar(
        select(func.count()).select_from(Workflow).where(Workflow.type == "KidLine")
    )
    assert count == 0


def test_children_follow_creates_rules_one_ongoing_per_hero(geneva_session, order):
    parent = KidOrderDuplicate.create(hero=order)
    speedrun_workflow(parent)
    assert ran == ["duplicate refused"]
    assert len(parent.children) == 1
    assert parent.children_open == 1  # the refused one is not counted
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished"


def test_start_child_outside_a_step_is_refused(geneva_session, order):
    parent = KidOrder.create(hero=order)
    geneva_session.commit()
    with pytest.raises(InvalidStateError, match=r"start_child\(\).*KidOrder #\d+.*create\(\)"):
        parent.start_child(KidLine, hero=order)
    assert parent.children_open == 0


# --- on_child_failure -------------------------------------------------------------------------


def _cancel_one_child(session, parent) -> Workflow:
    victim = parent.children[0]
    victim.cancel()
    session.commit()
    return victim


def test_a_canceled_child_pauses_the_parent_by_default(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    victim = _cancel_one_child(geneva_session, parent)
    speedrun_children(parent)
    speedrun_workflow(parent)  # the join wakes and applies on_child_failure
    assert parent.state == "paused"
    join = _join(geneva_session, parent)
    assert join.state == "canceled"
    assert join.error_class_name == children_module.CHILD_CANCELED
    assert "1 child workflow(s)" in (join.error_message or "")
    assert f"/workflows?parent={parent.id}&state=canceled" in (join.error_message or "")
    assert "invoice" not in ran
    assert parent.why_waiting().startswith("paused: child workflows ended canceled")
    payloads = {
        s.payload["child_id"]: s.payload["state"] for s in _child_signals(geneva_session, parent)
    }
    assert payloads[victim.id] == "canceled"

    parent.resume()  # the operator looked at the canceled child: go on
    geneva_session.commit()
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"


def test_on_child_failure_cancel_cancels_the_parent(geneva_session, order):
    parent = KidOrderCancel.create(hero=order)
    speedrun_workflow(parent)
    _cancel_one_child(geneva_session, parent)
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "canceled"
    assert _join(geneva_session, parent).state == "canceled"
    assert "invoice" not in ran


def test_on_child_failure_continue_runs_the_join(geneva_session, order):
    parent = KidOrderContinue.create(hero=order)
    speedrun_workflow(parent)
    _cancel_one_child(geneva_session, parent)
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"
    assert parent.children_canceled == 0  # answered by this join


def test_a_paused_child_keeps_the_parent_waiting_visibly(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    held = parent.children[0]
    held.pause()
    geneva_session.commit()
    speedrun_children(parent)  # the paused child stays paused
    assert held.state == "paused"
    assert _join(geneva_session, parent).state == "waiting"
    assert parent.why_waiting().startswith("1 child paused: waiting for them since")
    held.resume()
    geneva_session.commit()
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished"


class KidLineFails(Workflow):
    @step(on_exception="pause")
    def ship(self) -> None:
        raise RuntimeError("the courier is on strike")


class KidOrderWithFailures(Workflow):
    """Two children that pause after an error and two that ship."""

    @step
    def ship(self) -> None:
        for _ in range(2):
            self.start_child(KidLineFails, hero=self.hero, allow_multiple=True)
        for _ in range(2):
            self.start_child(KidSlowLine, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


def test_a_parents_line_says_first_the_children_paused_after_errors(geneva_session, order):
    parent = KidOrderWithFailures.create(hero=order)
    speedrun_workflow(parent)
    for kid in sorted(parent.children, key=lambda c: c.id):
        if isinstance(kid, KidLineFails):
            with pytest.raises(RuntimeError, match="strike"):  # raised after its commit
                perform_next_step(kid)  # pauses after its error
        else:
            speedrun_workflow(kid)
    assert parent.why_waiting().startswith("2 children paused after errors: waiting for them")
    assert children_module.summaries(geneva_session, [parent.id]) == {
        parent.id: {"paused_after_error": 2, "finished": 2}
    }


def test_a_parents_line_counts_each_kind_of_open_child(geneva_session, order):
    parent = KidOrderWithFailures.create(hero=order)
    speedrun_workflow(parent)
    kids = sorted(parent.children, key=lambda c: c.id)
    with pytest.raises(RuntimeError, match="strike"):
        perform_next_step(kids[0])  # pauses after its error
    kids[2].pause()
    geneva_session.commit()
    line = parent.why_waiting()
    assert line.startswith(
        "1 child paused after an error, 1 paused, 2 running: "
        "waiting for 4 child workflows to end since"
    ), line


# --- the parent's operators -------------------------------------------------------------------


def test_a_paused_parent_joins_on_resume(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    parent.pause()
    geneva_session.commit()
    speedrun_children(parent)  # their ends are counted, the paused parent is not woken
    assert parent.children_open == 0
    assert _join(geneva_session, parent).state == "waiting"
    parent.resume()
    geneva_session.commit()
    assert _join(geneva_session, parent).state == "scheduled"
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"


def test_a_paused_parent_resumed_with_children_still_running_waits_on(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    parent.pause()
    geneva_session.commit()
    parent.resume()
    geneva_session.commit()
    assert _join(geneva_session, parent).state == "waiting"
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished"


def test_cancel_children_cancels_the_ongoing_children_in_the_same_transaction(
    geneva_session, order
):
    parent = KidOrderCascade.create(hero=order)
    speedrun_workflow(parent)
    first, second = parent.children
    perform_next_step(first)
    speedrun_workflow(first)  # one child finished before the cancel
    assert first.state == "finished"
    parent.cancel()
    # Not committed yet: the children are canceled in this same transaction.
    assert second.state == "canceled"
    geneva_session.rollback()
    geneva_session.expire_all()
    assert parent.state == "ready" and second.state == "ready"  # rolled back together
    parent.cancel()
    geneva_session.commit()
    geneva_session.expire_all()
    assert parent.state == "canceled"
    assert first.state == "finished" and second.state == "canceled"
    assert [e.state for e in executions(geneva_session, second)] == ["canceled"]


def test_without_cancel_children_the_children_outlive_a_canceled_parent(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    parent.cancel()
    geneva_session.commit()
    speedrun_children(parent)
    assert {k.state for k in parent.children} == {"finished"}
    assert _child_signals(geneva_session, parent) == []  # nobody waits for them any more


# --- time-outs --------------------------------------------------------------------------------


def test_the_join_times_out(geneva_session, order):
    parent = KidOrderTimeout.create(hero=order)
    speedrun_workflow(parent)
    join = _join(geneva_session, parent)
    assert join.timeout_at is not None
    expire_wait(parent)
    assert parent.state == "canceled"
    assert _join(geneva_session, parent).outcome == "timed_out"
    speedrun_children(parent)  # late children end without waking anything
    assert parent.state == "canceled" and "invoice" not in ran


def test_on_timeout_run_runs_the_join_without_its_children(geneva_session, order):
    parent = KidOrderTimeoutRun.create(hero=order)
    speedrun_workflow(parent)
    expire_wait(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran == ["invoice"]
    assert _join(geneva_session, parent).outcome == "timed_out"


# --- exactly once -----------------------------------------------------------------------------


def test_a_childs_end_is_reported_once(geneva_session, order):
    parent = KidOrder.create(hero=order)
    speedrun_workflow(parent)
    speedrun_children(parent)
    child = parent.children[0]
    # Reported again (a bug, a replay): the dedup signal makes it a no-op.
    children_module.workflow_ended(child)
    geneva_session.commit()
    geneva_session.expire_all()
    assert parent.children_open == 0
    assert len(_child_signals(geneva_session, parent)) == 3


def test_a_child_ending_while_the_parent_still_creates_siblings(geneva_session, order):
    """Threads: each child runs in a worker thread of its own while the parent's resumable
    step, past a checkpoint, is still creating the next ones (and holds the parent's row)."""
    total = 5
    committed = [threading.Event() for _ in range(total)]
    done = [threading.Event() for _ in range(total)]
    errors: list[BaseException] = []

    def start(self: Workflow, it) -> None:  # type: ignore[no-untyped-def]
        def one(index: int) -> None:
            if index > 0:
                committed[index - 1].set()  # the previous child committed at the checkpoint
            self.start_child(KidLine, hero=self.hero, allow_multiple=True)

        it.iterate_over(range(total), one)

    def invoice(self: Workflow) -> None:
        ran.append("invoice")

    Racing = type(
        "KidRacingOrder",
        (Workflow,),
        {"ship": resumable_step(start), "invoice": step(wait_for_children=True)(invoice)},
    )

    def run_children() -> None:
        try:
            for index in range(total - 1):
                if not committed[index].wait(120):
                    raise TimeoutError(f"child {index} never committed")
                with other_session() as session:
                    ids = list(
                        session.scalars(
                            select(Workflow.id)
                            .where(Workflow.parent_id == parent_id)
                            .order_by(Workflow.id)
                        )
                    )
                    execution_id = session.scalar(
                        select(StepExecution.id).where(StepExecution.workflow_id == ids[index])
                    )
                execute(execution_id)
                done[index].set()
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    parent = Racing.create(hero=order)
    geneva_session.commit()
    parent_id = parent.id
    worker = threading.Thread(target=run_children)
    worker.start()
    try:
        speedrun_workflow(parent)
    finally:
        for event in committed:
            event.set()
        worker.join(120)
    assert not errors, errors
    assert all(d.is_set() for d in done[: total - 1])
    geneva_session.expire_all()  # the last child may have ended after speedrun_workflow returned
    kids = parent.children
    assert len(kids) == total
    assert [k.state for k in kids] == ["finished"] * (total - 1) + ["ready"]
    assert parent.children_open == 1
    assert _join(geneva_session, parent).state == "waiting"
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran.count("invoice") == 1
    assert len(_child_signals(geneva_session, parent)) == total


@pytest.mark.skipif(not on_server_database(), reason=SERVER_ONLY_REASON)
def test_a_child_ending_while_its_sibling_is_being_inserted_does_not_deadlock(
    geneva_session, order
):
    """The parent's step has inserted a second child (not committed) when the first child
    ends in another connection. The first child's end waits for the parent's transaction (on
    MariaDB its index writes would otherwise meet the sibling's uncommitted rows, and the
    parent's counter UPDATE at its commit would meet the end's lock on the parent: a deadlock);
    then both commit, and the join counts both children."""
    errors: list[BaseException] = []
    ended = threading.Event()

    def end_first(parent_id: int) -> None:
        try:
            with other_session() as session:
                first = session.scalar(
                    select(Workflow.id).where(Workflow.parent_id == parent_id).order_by(Workflow.id)
                )
                execution_id = session.scalar(
                    select(StepExecution.id).where(StepExecution.workflow_id == first)
                )
            execute(execution_id)
        except BaseException as error:  # reported by the test thread
            errors.append(error)
        finally:
            ended.set()

    def start(self: Workflow, it) -> None:  # type: ignore[no-untyped-def]
        def one(index: int) -> None:
            self.start_child(KidLine, hero=self.hero, allow_multiple=True)
            if index == 0:
                return  # committed at the checkpoint
            threading.Thread(target=end_first, args=(self.id,)).start()
            # Until the end waits for this transaction (or, without a lock to wait on, ends).
            with other_session() as monitor:
                for _ in range(400):
                    if ended.is_set() or lock_waiters(monitor):
                        break
                    monitor.rollback()
                    time.sleep(0.025)

        it.iterate_over(range(2), one)

    def invoice(self: Workflow) -> None:
        ran.append("invoice")

    Siblings = type(
        "KidSiblingsOrder",
        (Workflow,),
        {"ship": resumable_step(start), "invoice": step(wait_for_children=True)(invoice)},
    )
    parent = Siblings.create(hero=order)
    speedrun_workflow(parent)
    assert ended.wait(60), "the first child's end never returned"
    assert not errors, errors
    geneva_session.expire_all()
    assert [k.state for k in parent.children] == ["finished", "ready"]
    assert parent.children_open == 1
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran.count("invoice") == 1


# --- definitions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_child_failure": "pause"}, "does not wait for its children"),
        ({"wait_for_children": True, "on_child_failure": "retry"}, "invalid on_child_failure"),
        ({"wait_for_children": True, "wait_for": "paid"}, "both wait_for= and wait_for_children"),
        ({"wait_for_children": "yes"}, "invalid wait_for_children"),
        ({"wait_for_children": True, "timeout": 60}, "no on_timeout="),
    ],
)
def test_misconfigured_joins_are_refused_when_the_class_is_defined(options, message):
    with pytest.raises(StepConfigurationError, match=message) as info:
        type("KidBroken", (Workflow,), {"join": step(**options)(lambda self: None)})
    assert "Step 'join' of KidBroken" in str(info.value)


def test_a_child_can_be_found_from_another_session(geneva_session):
    parent = KidOrder.create(hero=make_order(geneva_session))
    speedrun_workflow(parent)
    with other_session() as session:
        loaded = session.get(Workflow, parent.children[0].id)
        assert loaded is not None and loaded.parent is not None
        assert loaded.parent.id == parent.id
        assert [k.id for k in session.get(Workflow, parent.id).children] == [
            k.id for k in parent.children
        ]


# --- children ending at once (10,000 of them: test_children_scale.py) --------------------------


def _assert_joined_once(session, parent: Workflow, ids: list[int]) -> None:
    session.expire_all()
    assert parent.children_open == 0
    assert _join(session, parent).state == "scheduled"  # woken by the last end
    speedrun_workflow(parent)
    assert parent.state == "finished" and joined == [parent.id]
    assert [e.state for e in executions(session, parent, "invoice")] == ["completed"]
    reported = select(Signal.idempotency_key).where(
        Signal.workflow_id == parent.id, Signal.name == children_module.CHILD_ENDED
    )
    keys = list(session.scalars(reported))
    assert len(keys) == len(set(keys)) == len(ids)
    assert set(keys) == {str(i) for i in ids}


def test_children_ending_at_once_are_joined_exactly_once(geneva_session, order):
    """Four threads cancel the children at once (an operator's cancel, one transaction each,
    the parent's row lock contended): every end is counted once, the last one wakes the join
    once."""
    parent, ids = start_fleet(geneva_session, order, 200)
    errors: list[BaseException] = []

    def end(share: list[int]) -> None:
        try:
            with other_session() as mine:
                for child_id in share:
                    child = mine.get(Workflow, child_id)
                    assert child is not None
                    child.cancel()
                    mine.commit()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=end, args=(ids[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    geneva_session.expire_all()
    assert parent.children_canceled == len(ids)
    _assert_joined_once(geneva_session, parent, ids)


# --- children under their own concurrency limit ------------------------------------------------

#: How many KidLimitedLine steps run at once (``now``) and at most (``max``).
limited_running = {"now": 0, "max": 0}
#: What a running KidLimitedLine step does first (the test sets it): called with the child.
limited_during: list = []


class KidLimitedLine(Workflow):
    """A child class with its own limit: at most two of its steps run at once, in one pool."""

    concurrency_limit = ConcurrencyLimit("kid-line-slots", limit=2)

    @step
    def ship(self) -> None:
        limited_running["now"] += 1
        limited_running["max"] = max(limited_running["max"], limited_running["now"])
        try:
            for action in list(limited_during):
                action(self)
            ran.append(f"limited {self.id}")
        finally:
            limited_running["now"] -= 1


class KidOrderLimited(Workflow):
    @step
    def ship(self) -> None:
        for _ in range(5):
            self.start_child(KidLimitedLine, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


def test_children_under_their_own_limit_defer_run_as_slots_free_and_are_joined_once(
    geneva_session, order, geneva_transport
):
    """Five children of a class limited to two at once: the first child's step runs the second
    (another worker), whose step runs the other three, which find both slots taken and defer
    (no attempt). Each end frees a slot and wakes the oldest deferred child; running what is
    delivered, the children run two at most at once, each once, and the last one's end wakes
    the parent's join, which runs once, after all of them."""
    limited_running.update(now=0, max=0)
    parent = KidOrderLimited.create(hero=order)
    speedrun_workflow(parent)
    kids = parent.children
    ids = [k.current_execution.id for k in kids]
    join = _join(geneva_session, parent)
    assert join.state == "waiting" and parent.children_open == 5
    geneva_session.commit()
    deferred: list[str] = []
    seen: list[str] = []

    def record(_sender, **payload) -> None:
        deferred.append(payload["limit"])

    def meanwhile(kid) -> None:
        if kid.id == kids[0].id:
            assert execute(ids[1])  # the second slot
        elif kid.id == kids[1].id:
            for execution_id in ids[2:]:  # both slots taken: each defers
                assert execute(execution_id)
            with other_session() as mine:
                waiter = mine.get(Workflow, kids[2].id)
                assert waiter is not None
                seen.append(waiter.why_waiting())

    limited_during.append(meanwhile)
    limit_deferred.connect(record)
    try:
        geneva_transport.clear()
        assert execute(ids[0])
    finally:
        limit_deferred.disconnect(record)
        limited_during.clear()

    assert deferred == ["kid-line-slots"] * 3
    assert seen == ["waiting for a slot of `kid-line-slots` (2 of 2 in use)"]
    assert ran == [f"limited {kids[1].id}", f"limited {kids[0].id}"]
    for execution_id in ids[2:]:
        execution = geneva_session.get(StepExecution, execution_id)
        geneva_session.refresh(execution)
        # Not an attempt: still scheduled, never started, no outcome.
        assert (execution.state, execution.started_at, execution.outcome) == (
            "scheduled",
            None,
            None,
        )
        assert execution.deferred_on is not None
        assert execution.deferred_on.startswith("kid-line-slots")
    geneva_session.expire_all()
    assert parent.children_open == 3
    assert _join(geneva_session, parent).state == "waiting"
    # The two ends freed two slots: each woke the oldest deferred child.
    assert geneva_transport.execution_ids == [ids[2], ids[3]]

    # A worker runs what is delivered, one message after another, until nothing is left.
    delivered: list[int] = []
    while geneva_transport.messages:
        execution_id = geneva_transport.messages.pop(0).execution_id
        delivered.append(execution_id)
        if execution_id == join.id:  # the join is delivered only once every child ended
            with other_session() as mine:
                states = mine.scalars(select(Workflow.state).where(Workflow.parent_id == parent.id))
                assert set(states) == {"finished"}
        assert execute(execution_id)
    assert delivered == [ids[2], ids[3], ids[4], join.id]
    assert limited_running["max"] == 2
    assert sorted(r for r in ran if r.startswith("limited")) == sorted(
        f"limited {k.id}" for k in kids
    )
    assert ran.count("invoice") == 1 and ran[-1] == "invoice"
    for kid in kids:
        assert summary(geneva_session, kid) == [("ship", "completed", "success")]
    geneva_session.expire_all()
    assert parent.state == "finished"
    assert (parent.children_open, parent.children_canceled) == (0, 0)
    assert [e.state for e in executions(geneva_session, parent, "invoice")] == ["completed"]
    keys = [s.idempotency_key for s in _child_signals(geneva_session, parent)]
    assert sorted(keys) == sorted(str(k.id) for k in kids)


# --- deploys: renamed_step and removed_step on a parent's waiting join -------------------------


def _v1_parent_parked(session, name: str) -> int:
    class V1(Workflow):
        workflow_name = name

        @step
        def ship(self) -> None:
            for _ in range(2):
                self.start_child(KidLine, hero=self.hero, allow_multiple=True)

        @step(wait_for_children=True)
        def invoice(self) -> None:
            ran.append("invoice v1")

        @step
        def archive(self) -> None:
            ran.append("archive")

    parent = V1.create(hero=make_order(session))
    speedrun_workflow(parent)
    assert _join(session, parent).state == "waiting"
    return parent.id


def _reloaded(session, workflow_id: int) -> Workflow:
    session.commit()
    session.expunge_all()
    found = session.get(Workflow, workflow_id)
    assert found is not None
    return found


def test_renamed_step_on_a_parents_waiting_join(geneva_session):
    from geneva_drive import housekeeping, renamed_step

    parent_id = _v1_parent_parked(geneva_session, "KidRenamedJoin")

    class V2(Workflow):
        workflow_name = "KidRenamedJoin"
        invoice = renamed_step(to="bill")

        @step
        def ship(self) -> None:
            pass

        @step(wait_for_children=True)
        def bill(self) -> None:
            ran.append("bill")

        @step
        def archive(self) -> None:
            ran.append("archive")

    assert housekeeping.run().stranded_waiting_released == 0  # still a join: it waits on
    parent = _reloaded(geneva_session, parent_id)
    assert parent.why_waiting().startswith("waiting for 2 child workflows to end")
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished"
    assert [r for r in ran if not r.startswith("line")] == ["bill", "archive"]
    assert V2.steps.names == ["ship", "bill", "archive"]


def test_removed_step_on_a_parents_waiting_join(geneva_session):
    from geneva_drive import housekeeping, removed_step

    parent_id = _v1_parent_parked(geneva_session, "KidRemovedJoin")

    class V2(Workflow):
        workflow_name = "KidRemovedJoin"

        @step
        def ship(self) -> None:
            pass

        invoice = removed_step()

        @step
        def archive(self) -> None:
            ran.append("archive")

    assert V2.steps.named("invoice").removed
    assert housekeeping.run().stranded_waiting_released == 1  # the gravestone is skipped
    parent = _reloaded(geneva_session, parent_id)
    speedrun_workflow(parent)  # the children need not end: nothing waits for them now
    assert parent.state == "finished"
    assert [r for r in ran if not r.startswith("line")] == ["archive"]
    speedrun_children(parent)  # their late ends change nothing
    assert _reloaded(geneva_session, parent_id).state == "finished"


# --- a child ending from inside its own step (the outcome table's direct transition) -------------


class KidCancelsItself(Workflow):
    @step
    def ship(self) -> None:
        self.cancel()


class KidFinishesEarly(Workflow):
    @step
    def ship(self) -> None:
        self.finish()

    @step
    def never(self) -> None:  # pragma: no cover - finish() ended the workflow
        ran.append("never")


class KidCancelPolicy(Workflow):
    @step(on_exception="cancel")
    def ship(self) -> None:
        raise RuntimeError("the parcel is lost")


class KidOrderMixedEnds(Workflow):
    @step
    def ship(self) -> None:
        for kind in (KidCancelsItself, KidFinishesEarly, KidCancelPolicy):
            self.start_child(kind, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True, on_child_failure="continue")
    def invoice(self) -> None:
        ran.append("invoice")


class KidStepless(Workflow):
    """No steps: create() finishes it, and its end reaches the parent inside start_child."""


class KidOrderSavepoint(Workflow):
    @step
    def ship(self) -> None:
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        savepoint = self.session.begin_nested()
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        savepoint.rollback()  # the two children inside go, and so does their share of the count
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        ran.append("invoice")


class KidOrderEndsInStep(Workflow):
    @step
    def ship(self) -> None:
        self.start_child(KidStepless, hero=self.hero, allow_multiple=True)
        self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        doomed = self.start_child(KidLine, hero=self.hero, allow_multiple=True)
        doomed.cancel()  # ends inside the step that started it

    @step(wait_for_children=True, on_child_failure="continue")
    def invoice(self) -> None:
        ran.append("invoice")


def test_a_savepoint_that_rolls_back_takes_its_children_out_of_the_count(geneva_session, order):
    """The counter gets a step's children in one UPDATE at its commit: a savepoint of the
    step's that rolls back drops its children and their share, the others are counted."""
    parent = KidOrderSavepoint.create(hero=order)
    speedrun_workflow(parent)
    geneva_session.expire_all()
    assert len(parent.children) == 2
    assert parent.children_open == 2
    assert _join(geneva_session, parent).state == "waiting"
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"


def test_children_that_end_inside_the_step_that_started_them_are_counted_once(
    geneva_session, order
):
    """A child with no steps (finished by create()) and one canceled by the same step report
    their ends while the step's starts are not written yet: the counter ends exact."""
    parent = KidOrderEndsInStep.create(hero=order)
    speedrun_workflow(parent)
    geneva_session.expire_all()
    assert sorted(k.state for k in parent.children) == ["canceled", "finished", "ready"]
    assert (parent.children_open, parent.children_canceled) == (1, 1)
    assert len(_child_signals(geneva_session, parent)) == 2
    assert _join(geneva_session, parent).state == "waiting"
    speedrun_children(parent)
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"


def test_a_child_ending_from_its_own_step_reaches_its_parent(geneva_session, order):
    """cancel() and finish() in a child's step, and a cancel policy, end the child through the
    outcome table's one transition: each end still reaches the parent (reviewer's F1)."""
    parent = KidOrderMixedEnds.create(hero=order)
    speedrun_workflow(parent)
    assert parent.children_open == 3
    for kid in parent.children:
        if isinstance(kid, KidCancelPolicy):  # re-raised after its outcome is committed
            with pytest.raises(RuntimeError, match="the parcel is lost"):
                execute(kid.current_execution.id)
        else:
            speedrun_workflow(kid)
    geneva_session.expire_all()
    assert sorted(k.state for k in parent.children) == ["canceled", "canceled", "finished"]
    assert parent.children_open == 0 and parent.children_canceled == 2
    signals = _child_signals(geneva_session, parent)
    assert sorted(s.payload["state"] for s in signals) == ["canceled", "canceled", "finished"]
    assert _join(geneva_session, parent).state == "scheduled"  # the last end woke it
    speedrun_workflow(parent)
    assert parent.state == "finished" and ran[-1] == "invoice"


class KidOrderCascadeCancelsItself(Workflow):
    cancel_children = True

    @step
    def ship(self) -> None:
        for _ in range(2):
            self.start_child(KidSlowLine, hero=self.hero, allow_multiple=True)

    @step
    def give_up(self) -> None:
        self.cancel()


def test_a_cancel_children_parent_canceling_itself_from_a_step_cancels_its_children(
    geneva_session, order
):
    parent = KidOrderCascadeCancelsItself.create(hero=order)
    speedrun_workflow(parent)
    geneva_session.expire_all()
    assert parent.state == "canceled"
    assert [k.state for k in parent.children] == ["canceled", "canceled"]
