"""Worker liveness (docs/MANUAL.md, "When a worker dies"), through the real executor, on every
database of the suite.

A step "runs on a worker" here the way it does in a Celery pool process: the test registers a
worker row and makes it the current thread's worker, so the executor's start records it. While
the step's body runs (``during``), the test ages that worker past its lease and runs the
recovery a dispatcher sweep runs; the body then carries on, as a stalled worker would, and
finalize finds its execution recovered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import select, update

from geneva_drive import (
    ConcurrencyLimit,
    Workflow,
    current_worker,
    db,
    dispatch,
    executor,
    housekeeping,
    liveness,
    step,
)
from geneva_drive.config import settings
from geneva_drive.embedded import EmbeddedWorker
from geneva_drive.errors import ConfigurationError
from geneva_drive.instrumentation import worker_recovered
from geneva_drive.models import Lease, StepExecution, Worker, utcnow
from geneva_drive.testing import expire_worker
from tests.conftest import Order
from tests.engine.helpers import executions, make_order

#: What a running step does (the test sets it): called with the workflow.
during: list[Callable[[Any], None]] = []


def _status(wf: Any) -> str:
    return str(wf.hero.status)


class LiveFlow(Workflow):
    """Two steps; the first calls back into the test while it runs and then writes its hero."""

    @step
    def work(self) -> None:
        for action in list(during):
            action(self)
        self.hero.status = "written by work"

    @step
    def after(self) -> None:
        pass


class LimitedLiveFlow(Workflow):
    concurrency_limit = ConcurrencyLimit("live-pool", limit=1, key=_status)

    @step
    def work(self) -> None:
        for action in list(during):
            action(self)


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    during.clear()
    yield
    during.clear()
    current_worker.set_thread(None)
    current_worker.set_process(None)


@pytest.fixture
def worker(geneva_session: Any) -> liveness.Heartbeat:
    """A registered worker (no heartbeat thread: the test decides its age) that runs the steps
    this thread executes."""
    heartbeat = liveness.register("celery", ["default"], name="celery@test-host/4242")
    current_worker.set_thread(heartbeat.worker_id, heartbeat.name)
    return heartbeat


def _create(session: Any, cls: type[Workflow] = LiveFlow, status: str = "new") -> Any:
    workflow = cls.create(hero=make_order(session, status))
    session.commit()
    return workflow


def _current(session: Any, workflow: Any) -> StepExecution:
    return [e for e in executions(session, workflow) if e.state in ("scheduled", "in_progress")][-1]


def _summary(session: Any, workflow: Any) -> list[tuple[str, str, str | None]]:
    return [(e.step_name, e.state, e.outcome) for e in executions(session, workflow)]


def _worker_row(worker_id: int) -> Worker:
    with db.new_session() as session:
        row = session.get(Worker, worker_id)
        assert row is not None
        session.expunge(row)
        return row


# --- the row and the heartbeat ------------------------------------------------------------------


def test_a_worker_registers_and_renews_its_heartbeat_from_its_own_thread(geneva_session):
    settings.worker_heartbeat_interval = 0.05
    settings.worker_lease = 1
    heartbeat = liveness.start_worker("embedded", name="embedded@here/1", process=False)
    try:
        first = _worker_row(heartbeat.worker_id)
        assert (first.name, first.kind, first.stopped_at) == ("embedded@here/1", "embedded", None)
        assert first.code_version  # a digest of the registered plans, or GENEVA_CODE_VERSION
        deadline = time.monotonic() + 10
        while _worker_row(heartbeat.worker_id).heartbeat_at <= first.heartbeat_at:
            assert time.monotonic() < deadline, "the heartbeat was never renewed"
            time.sleep(0.02)
        assert [w.id for w in liveness.live_workers(geneva_session)] == [heartbeat.worker_id]
    finally:
        heartbeat.stop()
    stopped = _worker_row(heartbeat.worker_id)
    assert stopped.stopped_at is not None
    assert liveness.state_of(stopped) == "stopped"
    assert liveness.live_workers(geneva_session) == []


def test_a_lease_one_late_heartbeat_would_expire_is_refused(geneva_session):
    settings.worker_heartbeat_interval = 10
    settings.worker_lease = 15
    with pytest.raises(ConfigurationError, match=r"GENEVA_WORKER_LEASE.*GENEVA_WORKER_HEARTBEAT"):
        liveness.start_worker("celery", process=False)
    with db.new_session() as session:
        assert session.scalars(select(Worker)).all() == []  # nothing half-written


def test_the_start_statement_records_the_worker(geneva_session, worker):
    workflow = _create(geneva_session)
    seen: list[int | None] = []

    def look(wf: Any) -> None:
        with db.new_session() as session:
            seen.append(session.get(StepExecution, _current(geneva_session, workflow).id).worker_id)

    during.append(look)
    executor.execute(_current(geneva_session, workflow).id)
    assert seen == [worker.worker_id]  # committed with the start, before the body ran
    [work] = [e for e in executions(geneva_session, workflow) if e.step_name == "work"]
    assert work.worker_id == worker.worker_id


# --- recovery of an expired worker's step --------------------------------------------------------


@pytest.mark.parametrize("action", ["reattempt", "cancel"])
def test_an_expired_workers_step_is_recovered_at_once_and_its_attempt_discarded(
    geneva_session, worker, action, caplog
):
    """The worker's lease expires while its step runs: the sweep recovers the execution through
    stuck_recovery_action at once (not after stuck_in_progress_threshold), and when the stalled
    body ends, finalize discards its attempt, writes included, and says so naming the worker."""
    settings.stuck_recovery_action = action
    workflow = _create(geneva_session)
    recovered: list[int] = []
    announced: list[dict[str, Any]] = []

    def on_recovered(_sender: Any, **payload: Any) -> None:
        announced.append(payload)

    def lease_lost(wf: Any) -> None:
        expire_worker(worker.worker_id)
        with db.new_session() as session:
            recovered.append(liveness.recover_expired(session))

    during.append(lease_lost)
    worker_recovered.connect(on_recovered)
    try:
        with caplog.at_level(logging.WARNING, logger="geneva_drive"):
            executor.execute(_current(geneva_session, workflow).id)
    finally:
        worker_recovered.disconnect(on_recovered)
    assert recovered == [1]
    assert [(p["worker_name"], p["step_name"], p["action"]) for p in announced] == [
        ("celery@test-host/4242", "work", action)
    ]
    geneva_session.expire_all()
    # The body's write to its hero was discarded with the attempt.
    assert geneva_session.get(Order, workflow.hero_id).status == "new"
    if action == "reattempt":
        assert _summary(geneva_session, workflow) == [
            ("work", "completed", "recovered"),
            ("work", "scheduled", None),
        ]
        assert workflow.state == "ready"
    else:
        assert _summary(geneva_session, workflow) == [("work", "canceled", "recovered")]
        geneva_session.refresh(workflow)
        assert workflow.state == "canceled"
    assert any(
        "celery@test-host/4242 lost its lease" in r.getMessage() and "discarded" in r.getMessage()
        for r in caplog.records
    )


def test_a_live_workers_step_is_never_recovered_however_long_it_runs(geneva_session, worker):
    """Started two hours ago (past stuck_in_progress_threshold) on a worker that still beats:
    neither the sweep nor housekeeping touches it. The same row with no worker recorded is
    still recovered by age, as before."""
    workflow = _create(geneva_session)
    results: list[tuple[int, int]] = []

    def hours_later(wf: Any) -> None:
        long_ago = utcnow() - timedelta(hours=2)
        with db.transaction() as session:
            session.execute(
                update(StepExecution)
                .where(StepExecution.id == _current(geneva_session, workflow).id)
                .values(started_at=long_ago)
            )
        worker.beat()  # the heartbeat thread of a live process did this all along
        report = housekeeping.run()
        swept = liveness.recover_expired()
        results.append((report.stuck_in_progress_recovered + report.worker_recoveries, swept))

    during.append(hours_later)
    executor.execute(_current(geneva_session, workflow).id)
    assert results == [(0, 0)]
    assert _summary(geneva_session, workflow)[0] == ("work", "completed", "success")
    geneva_session.expire_all()
    assert geneva_session.get(Order, workflow.hero_id).status == "written by work"

    # No worker recorded (the test helpers, an older version): the age rule still applies.
    current_worker.set_thread(None)
    other = _create(geneva_session)
    long_ago = utcnow() - timedelta(hours=2)

    def age_it(wf: Any) -> None:
        with db.transaction() as session:
            session.execute(
                update(StepExecution)
                .where(StepExecution.id == _current(geneva_session, other).id)
                .values(started_at=long_ago)
            )
        results.append((housekeeping.run().stuck_in_progress_recovered, 0))

    during[:] = [age_it]
    executor.execute(_current(geneva_session, other).id)
    assert results[-1] == (1, 0)


def test_two_dispatchers_recover_each_expired_execution_once(geneva_session, worker):
    """Several sweeps at once: every execution of the dead worker is recovered exactly once
    (one recovered row, one new attempt each)."""
    workflows = [_create(geneva_session) for _ in range(6)]

    def die_mid_step(wf: Any) -> None:
        raise _Killed()

    during.append(die_mid_step)
    for workflow in workflows:
        with pytest.raises(_Killed):
            executor.execute(_current(geneva_session, workflow).id)
    for workflow in workflows:
        assert _summary(geneva_session, workflow) == [("work", "in_progress", None)]
    expire_worker(worker.worker_id)
    counts: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def sweep() -> None:
        try:
            barrier.wait(10)
            counts.append(dispatch.recover_dead_workers())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sum(counts) == len(workflows)
    for workflow in workflows:
        assert _summary(geneva_session, workflow) == [
            ("work", "completed", "recovered"),
            ("work", "scheduled", None),
        ]


class _Killed(BaseException):
    """What a SIGKILL does to a step, as far as the database can tell: the body never returns
    and nothing after the start is committed."""


def test_the_dispatch_sweep_recovers_expired_workers(geneva_session, worker):
    workflow = _create(geneva_session)

    def die(wf: Any) -> None:
        raise _Killed()

    during.append(die)
    with pytest.raises(_Killed):
        executor.execute(_current(geneva_session, workflow).id)
    dispatch.dispatch_due()
    assert _summary(geneva_session, workflow) == [("work", "in_progress", None)]  # still live
    expire_worker(worker.worker_id)
    dispatch.dispatch_due()
    assert [s[:2] for s in _summary(geneva_session, workflow)] == [
        ("work", "completed"),
        ("work", "scheduled"),
    ]
    # Housekeeping counts what it recovered itself (nothing left now).
    assert housekeeping.run().worker_recoveries == 0


def test_a_recovered_execution_frees_its_concurrency_slot(geneva_session, worker):
    """The dead worker's slot goes to the next execution waiting for it at once."""
    holder = _create(geneva_session, LimitedLiveFlow, "acme")
    waiter = _create(geneva_session, LimitedLiveFlow, "acme")
    seen: list[str | None] = []

    def meanwhile(wf: Any) -> None:
        if wf.id != holder.id:
            return
        executor.execute(_current(geneva_session, waiter).id)  # deferred: the slot is taken
        with db.new_session() as session:
            seen.append(session.get(StepExecution, _current(geneva_session, waiter).id).deferred_on)
        raise _Killed()

    during.append(meanwhile)
    with pytest.raises(_Killed):
        executor.execute(_current(geneva_session, holder).id)
    assert seen == ["live-pool/acme"]
    expire_worker(worker.worker_id)
    assert liveness.recover_expired() == 1
    woken = _current(geneva_session, waiter)
    assert woken.state == "scheduled" and woken.scheduled_for <= utcnow()
    during.clear()
    executor.execute(woken.id)  # it gets the freed slot
    assert _summary(geneva_session, waiter) == [("work", "completed", "success")]


# --- a clean stop --------------------------------------------------------------------------------


def test_an_embedded_worker_stops_cleanly_and_is_never_recovered(geneva_session):
    settings.worker_heartbeat_interval = 0.05
    settings.worker_lease = 0.2
    workflow = _create(geneva_session)
    embedded = EmbeddedWorker(concurrency=1, poll_interval=0.01)
    embedded.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            geneva_session.expire_all()
            geneva_session.refresh(workflow)
            if workflow.state == "finished":
                break
            assert time.monotonic() < deadline, "the embedded worker never finished the workflow"
            time.sleep(0.02)
    finally:
        assert embedded.stop(timeout=10)
    [row] = geneva_session.scalars(select(Worker)).all()
    assert row.kind == "embedded" and row.stopped_at is not None
    assert {e.worker_id for e in executions(geneva_session, workflow)} == {row.id}
    time.sleep(0.3)  # past its lease: stopped, not expired, and nothing to recover
    assert liveness.state_of(row) == "stopped"
    assert liveness.recover_expired() == 0


# --- stuck scheduled: judged by when the message was sent ----------------------------------------


def test_a_scheduled_row_is_stuck_only_when_its_message_is_old_or_was_never_sent(geneva_session):
    overdue = utcnow() - timedelta(minutes=20)
    queued, lost, unsent = (_create(geneva_session) for _ in range(3))
    values = {
        queued.id: {"scheduled_for": overdue, "sent_at": utcnow() - timedelta(minutes=1)},
        lost.id: {"scheduled_for": overdue, "sent_at": overdue},
        unsent.id: {"scheduled_for": overdue, "sent_at": None},
    }
    for workflow_id, columns in values.items():
        geneva_session.execute(
            update(StepExecution).where(StepExecution.workflow_id == workflow_id).values(**columns)
        )
    geneva_session.commit()
    assert housekeeping.run().stuck_scheduled_recovered == 2
    # The row sent a minute ago waits in the broker's queue behind a backlog: recovering it
    # would only add a message to that backlog.
    assert _summary(geneva_session, queued) == [("work", "scheduled", None)]
    for workflow in (lost, unsent):
        assert _summary(geneva_session, workflow) == [
            ("work", "completed", "recovered"),
            ("work", "scheduled", None),
        ]


# --- housekeeping never overlaps -----------------------------------------------------------------


def test_a_housekeeping_run_skips_while_another_holds_the_lease(geneva_session):
    lost = _create(geneva_session)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == lost.id)
        .values(scheduled_for=utcnow() - timedelta(hours=1), sent_at=None)
    )
    geneva_session.commit()
    with liveness.hold_lease(housekeeping.LEASE_NAME, timedelta(minutes=5)) as held:
        assert held
        report = housekeeping.run()
        assert (report.skipped_overlapping, report.stuck_scheduled_recovered) == (1, 0)
    assert housekeeping.run().stuck_scheduled_recovered == 1
    # A holder that died lets the lease lapse.
    with db.transaction() as session:
        session.merge(Lease(name="housekeeping", holder="dead", expires_at=utcnow()))
    assert housekeeping.run().skipped_overlapping == 0


def test_a_held_lease_is_renewed_while_its_run_goes_on_and_lapses_when_its_holder_dies(
    geneva_session,
):
    with liveness.hold_lease("probe", timedelta(seconds=0.3), holder="first") as held:
        assert held
        time.sleep(0.7)  # over twice its duration: only the renewals keep it
        with liveness.hold_lease("probe", timedelta(seconds=0.3), holder="second") as other:
            assert not other
    with liveness.hold_lease("probe", timedelta(seconds=0.3), holder="second") as other:
        assert other  # handed back at the end of the block
    # A holder killed mid-run renews nothing: its lease lapses after its duration.
    with db.transaction() as session:
        session.merge(
            Lease(name="probe", holder="dead", expires_at=utcnow() + timedelta(seconds=0.3))
        )
    with liveness.hold_lease("probe", timedelta(seconds=0.3), holder="third") as other:
        assert not other
    time.sleep(0.4)
    with liveness.hold_lease("probe", timedelta(seconds=0.3), holder="third") as other:
        assert other


def test_a_run_handed_a_later_now_judges_leases_by_the_real_clock(geneva_session, worker):
    """Housekeeping or a sweep run "a month later" (a catch-up, a test) must not take every
    live worker for dead: leases are judged by the clock heartbeats are written with."""
    workflow = _create(geneva_session)
    seen: list[tuple[int, int]] = []

    def a_month_later(wf: Any) -> None:
        worker.beat()
        later = utcnow() + timedelta(days=31)
        report = housekeeping.run(now=later)
        dispatch.dispatch_due(later)
        seen.append((report.worker_recoveries, report.stuck_in_progress_recovered))

    during.append(a_month_later)
    executor.execute(_current(geneva_session, workflow).id)
    assert seen == [(0, 0)]
    assert _summary(geneva_session, workflow)[0] == ("work", "completed", "success")
    assert _worker_row(worker.worker_id).stopped_at is None  # not pruned either


# --- an attempt its live worker could not finish ------------------------------------------------


def _finalize_fails_once(monkeypatch: Any) -> None:
    """The database drops the connection in the middle of the step's finalize, once."""
    from sqlalchemy.exc import OperationalError

    from geneva_drive.executor import Executor

    real = Executor.finalize
    calls = {"n": 0}

    def finalize(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("UPDATE …", {}, Exception("server closed the connection"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Executor, "finalize", finalize)


def test_an_attempt_a_live_worker_could_not_finalize_is_recovered_by_its_heartbeat(
    geneva_session, monkeypatch
):
    """Its worker lives on, so its lease never expires for the step: before this, the row
    stayed in progress for good, and a limited step held its slot for good (the next in line
    waited forever). The heartbeat recovers it within one interval."""
    settings.worker_heartbeat_interval = 0.05
    settings.worker_lease = 5
    heartbeat = liveness.start_worker("embedded", name="embedded@here/abandon", process=False)
    current_worker.set_thread(heartbeat.worker_id, heartbeat.name)
    try:
        first = _create(geneva_session, LimitedLiveFlow, status="t1")
        second = _create(geneva_session, LimitedLiveFlow, status="t1")
        held = _current(geneva_session, first)
        _finalize_fails_once(monkeypatch)
        with pytest.raises(Exception, match="server closed the connection"):
            executor.execute(held.id)
        geneva_session.expire_all()
        assert geneva_session.get(StepExecution, held.id).state == "in_progress"

        deadline = time.monotonic() + 20
        while geneva_session.get(StepExecution, held.id).outcome != "recovered":
            assert time.monotonic() < deadline, "the heartbeat never recovered the step"
            time.sleep(0.05)
            geneva_session.expire_all()
        # Run again (stuck_recovery_action "reattempt"), and its slot is free for the next.
        assert _summary(geneva_session, first)[:2] == [
            ("work", "completed", "recovered"),
            ("work", "scheduled", None),
        ]
        waiting = _current(geneva_session, second)
        executor.execute(waiting.id)
        geneva_session.expire_all()
        assert geneva_session.get(StepExecution, waiting.id).state == "completed"
        assert current_worker.abandoned(heartbeat.worker_id) == []
    finally:
        heartbeat.stop()


def test_outside_a_registered_worker_nothing_is_abandoned(geneva_session, monkeypatch):
    """A test helper or a script runs steps with no worker: its stuck rows keep the hour-long
    threshold of housekeeping, and nothing is queued for a heartbeat that does not exist."""
    workflow = _create(geneva_session)
    _finalize_fails_once(monkeypatch)
    with pytest.raises(Exception, match="server closed the connection"):
        executor.execute(_current(geneva_session, workflow).id)
    assert current_worker._abandoned == {}


class HookFailsFlow(Workflow):
    """Its hook raises once after the step started: the attempt escapes in progress."""

    failures: ClassVar[list[int]] = [1]

    def before_step_execution(self, execution: Any) -> None:
        if HookFailsFlow.failures:
            HookFailsFlow.failures.pop()
            raise RuntimeError("hook exploded")

    @step
    def work(self) -> None:
        pass


def test_an_attempt_whose_hook_raised_in_a_live_worker_is_recovered_by_its_heartbeat(
    geneva_session,
):
    settings.worker_heartbeat_interval = 0.05
    settings.worker_lease = 5
    HookFailsFlow.failures[:] = [1]
    heartbeat = liveness.start_worker("embedded", name="embedded@here/hook", process=False)
    current_worker.set_thread(heartbeat.worker_id, heartbeat.name)
    try:
        workflow = _create(geneva_session, HookFailsFlow)
        held = _current(geneva_session, workflow)
        with pytest.raises(RuntimeError, match="hook exploded"):
            executor.execute(held.id)
        deadline = time.monotonic() + 20
        geneva_session.expire_all()
        while geneva_session.get(StepExecution, held.id).outcome != "recovered":
            assert time.monotonic() < deadline, "the heartbeat never recovered the step"
            time.sleep(0.05)
            geneva_session.expire_all()
        assert _summary(geneva_session, workflow)[:2] == [
            ("work", "completed", "recovered"),
            ("work", "scheduled", None),
        ]
    finally:
        heartbeat.stop()
