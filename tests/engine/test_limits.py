"""Concurrency and rate limits per key (docs/MANUAL.md, "Concurrency and rate limits"), through
the real executor.

A slot is held by an execution in progress: a test holds one by running a step whose body
calls back into the test (``during``), where other executions are then run (each in its own
session, as another worker would) and deferred. Races use real threads on real connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from geneva_drive import ConcurrencyLimit, RateLimit, Workflow, db, executor, inline, step
from geneva_drive.config import settings
from geneva_drive.errors import StepConfigurationError
from geneva_drive.housekeeping import run as housekeeping
from geneva_drive.instrumentation import limit_deferred
from geneva_drive.limits import RECHECK_AFTER, in_use, usage
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.workflow import unregister
from tests.engine.helpers import executions, make_order

#: What a running step does (the test sets it): called with the workflow.
during: list[Callable[[Any], None]] = []


def _body(self: Any) -> None:
    for action in list(during):
        action(self)


def _status(wf: Any) -> str:
    return str(wf.hero.status)


class TenantSync(Workflow):
    """One step, at most one at a time per order status (the "tenant")."""

    concurrency_limit = ConcurrencyLimit("tenant-pool", limit=1, key=_status)

    @step
    def sync(self) -> None:
        _body(self)


class ExportFlow(Workflow):
    """A free first step, then a step limited to 1 in one pool (for inline successors)."""

    @step
    def prepare(self) -> None:
        pass

    @step(concurrency_limit=ConcurrencyLimit("exports", limit=1))
    def export(self) -> None:
        _body(self)


class ShopCall(Workflow):
    @step(rate_limit=RateLimit("shop-api", limit=2, per=timedelta(hours=1), key=_status))
    def call_api(self) -> None:
        pass


class Both(Workflow):
    """A class limit (2 per tenant) and a step limit (1 in one pool) together."""

    concurrency_limit = ConcurrencyLimit("tenant-both", limit=2, key=_status)

    @step(concurrency_limit=ConcurrencyLimit("both-step", limit=1))
    def work(self) -> None:
        _body(self)


class BothClassFull(Workflow):
    """A class limit (1 per tenant) over a free step and a step limited to 1 in one pool."""

    concurrency_limit = ConcurrencyLimit("class-full", limit=1, key=_status)

    @step
    def free(self) -> None:
        _body(self)

    @step(concurrency_limit=ConcurrencyLimit("class-full-step", limit=1))
    def limited(self) -> None:
        _body(self)


@pytest.fixture(autouse=True)
def _clear() -> Any:
    during.clear()
    yield
    during.clear()


def _create(session: Any, cls: type[Workflow], status: str = "new") -> Any:
    workflow = cls.create(hero=make_order(session, status))
    session.commit()
    return workflow


def _current(session: Any, workflow: Any) -> StepExecution:
    return next(e for e in executions(session, workflow) if e.state in ("scheduled", "in_progress"))


def _run(execution_id: int) -> None:
    executor.execute(execution_id)


def _states(session: Any, workflow: Any) -> list[tuple[str, str, str | None]]:
    return [(e.step_name, e.state, e.outcome) for e in executions(session, workflow)]


# --- definitions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"concurrency_limit": RateLimit("x", limit=1, per=1)},
            "BadClass.concurrency_limit is a RateLimit",
        ),
        ({"concurrency_limit": 5}, "use ConcurrencyLimit(name"),
        ({"concurrency_limit": ConcurrencyLimit("x", limit=0)}, "limit must be a whole number"),
        ({"concurrency_limit": ConcurrencyLimit("no spaces", limit=1)}, "a limit's name is"),
        (
            {"concurrency_limit": ConcurrencyLimit("x", limit=1, key="no_such_method")},
            "defines no method 'no_such_method'",
        ),
        (
            {"go": step(rate_limit=ConcurrencyLimit("x", limit=1))(lambda self: None)},
            "Step 'go' of BadClass has rate_limit=",
        ),
        (
            {"go": step(concurrency_limit=RateLimit("x", limit=1, per=1))(lambda self: None)},
            "pass it as rate_limit= instead",
        ),
        (
            {"go": step(rate_limit=RateLimit("x", limit=1, per=0))(lambda self: None)},
            "per must be positive",
        ),
        (
            {"go": step(rate_limit=RateLimit("x", limit=1, per="1s"))(lambda self: None)},
            "per must be a datetime.timedelta or seconds",
        ),
        (
            {"go": step(rate_limit=RateLimit("x", limit=1, per=1, key=42))(lambda self: None)},
            "key must be a callable",
        ),
    ],
)
def test_misconfiguration_is_refused_when_the_class_is_defined(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(StepConfigurationError, match=None) as raised:
        type("BadClass", (Workflow,), dict(body))
    assert message in str(raised.value)
    assert "BadClass" in str(raised.value)


def test_one_name_is_one_kind_of_limit() -> None:
    with pytest.raises(StepConfigurationError) as raised:

        class Clash(Workflow):
            @step(rate_limit=RateLimit("tenant-pool", limit=1, per=1))
            def go(self) -> None: ...

    assert "'tenant-pool'" in str(raised.value) and "TenantSync" in str(raised.value)
    unregister("Clash")


def test_keys_are_evaluated_at_creation_and_stored_on_the_row(geneva_session: Any) -> None:
    sync = _create(geneva_session, TenantSync, "acme")
    call = _create(geneva_session, ShopCall, "acme")
    export = _create(geneva_session, ExportFlow)
    assert _current(geneva_session, sync).limit_slot == "tenant-pool/acme"
    assert _current(geneva_session, call).rate_slot == "shop-api/acme"
    first = _current(geneva_session, export)
    assert (first.limit_slot, first.step_limit_slot, first.rate_slot) == (None, None, None)
    _run(first.id)
    assert _current(geneva_session, export).step_limit_slot == "exports/"


def test_a_key_of_none_leaves_the_execution_unlimited(geneva_session: Any) -> None:
    class MaybeLimited(Workflow):
        concurrency_limit = ConcurrencyLimit("maybe", limit=1, key=lambda wf: None)

        @step
        def go(self) -> None: ...

    try:
        workflow = _create(geneva_session, MaybeLimited)
        assert _current(geneva_session, workflow).limit_slot is None
    finally:
        unregister("MaybeLimited")


def test_a_key_that_raises_says_which_limit_and_step(geneva_session: Any) -> None:
    class BadKey(Workflow):
        concurrency_limit = ConcurrencyLimit("bad-key", limit=1, key=lambda wf: wf.hero.nope)

        @step
        def go(self) -> None: ...

    try:
        with pytest.raises(AttributeError) as raised:
            BadKey.create(hero=make_order(geneva_session))
        notes = " ".join(getattr(raised.value, "__notes__", []))
        assert "ConcurrencyLimit('bad-key')" in notes and "step 'go' of BadKey" in notes
    finally:
        geneva_session.rollback()
        unregister("BadKey")


def test_a_deferred_execution_of_a_paused_workflow_holds_no_place(geneva_session: Any) -> None:
    holder = _create(geneva_session, TenantSync, "acme")
    paused, newer = (_create(geneva_session, TenantSync, "acme") for _ in range(2))

    def meanwhile(wf: Any) -> None:
        if wf.id == holder.id:
            _run(_current(geneva_session, paused).id)  # deferred, then its workflow paused
            session = db.new_session()
            try:
                session.get(Workflow, paused.id).pause()
                session.commit()
            finally:
                session.close()

    during.append(meanwhile)
    _run(_current(geneva_session, holder).id)
    # Woken before it was paused (due now): its place in line would keep the free slot for it.
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == paused.id, StepExecution.state == "scheduled")
        .values(scheduled_for=utcnow() - timedelta(seconds=1))
    )
    geneva_session.commit()
    assert executions(geneva_session, paused)[0].deferred_on == "tenant-pool/acme"
    # The slot is free; the older, paused one's place does not hold the newer one back.
    _run(_current(geneva_session, newer).id)
    assert _states(geneva_session, newer) == [("sync", "completed", "success")]


# --- concurrency -------------------------------------------------------------------------------


def test_no_slot_defers_without_an_attempt_and_the_freed_slot_wakes_the_oldest(
    geneva_session: Any, geneva_transport: Any
) -> None:
    holder = _create(geneva_session, TenantSync, "acme")
    first, second = (_create(geneva_session, TenantSync, "acme") for _ in range(2))
    other_tenant = _create(geneva_session, TenantSync, "globex")
    ids = {wf.id: _current(geneva_session, wf).id for wf in (holder, first, second, other_tenant)}
    deferred: list[dict[str, Any]] = []

    def record(_sender: Any, **payload: Any) -> None:
        deferred.append(payload)

    def meanwhile(wf: Any) -> None:
        if wf.id != holder.id:
            return
        # Another worker picks up the newer one first: deferred, then the older one: deferred.
        _run(ids[second.id])
        _run(ids[first.id])
        _run(ids[other_tenant.id])  # another key: never blocked by acme's slot

    during.append(meanwhile)
    limit_deferred.connect(record)
    try:
        geneva_transport.clear()
        _run(ids[holder.id])
    finally:
        limit_deferred.disconnect(record)

    assert [p["limit"] for p in deferred] == ["tenant-pool", "tenant-pool"]
    assert _states(geneva_session, other_tenant) == [("sync", "completed", "success")]
    assert _states(geneva_session, holder) == [("sync", "completed", "success")]
    waiting = {wf.id: _current(geneva_session, wf) for wf in (first, second)}
    for execution in waiting.values():
        # Not an attempt: still scheduled, never started, no outcome, the same row.
        assert (execution.state, execution.started_at, execution.outcome) == (
            "scheduled",
            None,
            None,
        )
        assert execution.deferred_on == "tenant-pool/acme"
    # The holder's end woke the oldest (first), not the one deferred first (second).
    now = utcnow()
    assert waiting[first.id].scheduled_for <= now
    assert waiting[second.id].scheduled_for > now + RECHECK_AFTER / 2
    assert geneva_transport.execution_ids == [ids[first.id]]
    # Before it runs, a newer execution cannot take the woken one's slot.
    _run(ids[second.id])
    assert _current(geneva_session, second).state == "scheduled"
    assert second.why_waiting() == "waiting for a slot of `tenant-pool` [acme] (0 of 1 in use)"
    _run(ids[first.id])
    assert _states(geneva_session, first) == [("sync", "completed", "success")]
    assert geneva_transport.execution_ids[-1] == ids[second.id]
    _run(ids[second.id])
    assert _states(geneva_session, second) == [("sync", "completed", "success")]
    assert _current_or_none(geneva_session, second) is None


def _current_or_none(session: Any, workflow: Any) -> StepExecution | None:
    found = [e for e in executions(session, workflow) if e.deferred_on and e.state == "scheduled"]
    return found[0] if found else None


def test_why_line_and_usage_while_a_slot_is_taken(geneva_session: Any) -> None:
    holder = _create(geneva_session, TenantSync, "acme")
    waiter = _create(geneva_session, TenantSync, "acme")
    seen: list[str] = []

    def meanwhile(wf: Any) -> None:
        if wf.id == holder.id:
            _run(_current(geneva_session, waiter).id)
            session = db.new_session()
            try:
                seen.append(session.get(Workflow, waiter.id).why_waiting())
                [limit] = [u for u in usage(session) if u.name == "tenant-pool"]
                seen.append(f"{limit.in_use} {limit.waiting} {limit.top_keys}")
            finally:
                session.close()

    during.append(meanwhile)
    _run(_current(geneva_session, holder).id)
    assert seen == [
        "waiting for a slot of `tenant-pool` [acme] (1 of 1 in use)",
        "1 1 [('acme', 1, 1)]",
    ]


def test_a_killed_workers_slot_frees_through_stuck_recovery(
    geneva_session: Any, geneva_transport: Any
) -> None:
    dead = _create(geneva_session, TenantSync, "acme")
    waiter = _create(geneva_session, TenantSync, "acme")
    # The worker died mid-step: its execution is in progress, long ago.
    long_ago = utcnow() - settings.stuck_in_progress_threshold - timedelta(minutes=5)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == _current(geneva_session, dead).id)
        .values(state="in_progress", started_at=long_ago)
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == dead.id).values(state="performing")
    )
    geneva_session.commit()
    waiting_id = _current(geneva_session, waiter).id
    _run(waiting_id)
    assert geneva_session.get(StepExecution, waiting_id).deferred_on == "tenant-pool/acme"
    geneva_transport.clear()
    report = housekeeping()
    assert report.stuck_in_progress_recovered == 1
    # The recovery woke it: due now, its message sent.
    assert waiting_id in geneva_transport.execution_ids
    assert geneva_session.get(StepExecution, waiting_id).scheduled_for <= utcnow()
    _run(waiting_id)
    geneva_session.expire_all()
    assert geneva_session.get(StepExecution, waiting_id).state == "completed"


def test_inline_successors_obey_limits(geneva_session: Any) -> None:
    holder = _create(geneva_session, ExportFlow)
    _run(_current(geneva_session, holder).id)  # prepare; export is next
    other = _create(geneva_session, ExportFlow)

    def meanwhile(wf: Any) -> None:
        if wf.id == holder.id:
            # A worker runs other's first step, with inline successors on: export is claimed
            # by the same worker at once, and deferred there, as a delivered message would be.
            executor.execute(_current(geneva_session, other).id, budget=inline.budget())

    during.append(meanwhile)
    _run(_current(geneva_session, holder).id)
    steps = _states(geneva_session, other)
    assert steps == [("prepare", "completed", "success"), ("export", "scheduled", None)]
    assert executions(geneva_session, other)[-1].deferred_on == "exports/"


def test_class_and_step_limits_apply_together(geneva_session: Any) -> None:
    holder = _create(geneva_session, Both, "acme")
    other_tenant = _create(geneva_session, Both, "globex")

    seen: list[int] = []

    def meanwhile(wf: Any) -> None:
        if wf.id == holder.id:
            # The class limit (2 per tenant) has room for globex; the step's pool does not.
            _run(_current(geneva_session, other_tenant).id)
            session = db.new_session()
            try:
                seen.append(in_use(session, "tenant-both/globex"))  # deferred: no class slot
            finally:
                session.close()

    during.append(meanwhile)
    _run(_current(geneva_session, holder).id)
    assert _current(geneva_session, other_tenant).deferred_on == "both-step/"
    assert seen == [0]


def test_a_full_class_limit_defers_and_the_deferred_execution_holds_no_step_slot(
    geneva_session: Any,
) -> None:
    """The reverse of the test above: the class limit (1 per tenant) is full, the step's pool
    has room. The execution is deferred on the class limit and takes no step slot: another
    tenant's execution of the same step runs meanwhile."""
    holder = _create(geneva_session, BothClassFull, "acme")
    waiter = _create(geneva_session, BothClassFull, "acme")
    other_tenant = _create(geneva_session, BothClassFull, "globex")
    for workflow in (waiter, other_tenant):
        _run(_current(geneva_session, workflow).id)  # free; ``limited`` is next
    seen: list[Any] = []

    def meanwhile(wf: Any) -> None:
        if wf.id != holder.id:
            return
        # holder runs ``free``: acme's class slot is taken, the step's pool is empty.
        _run(_current(geneva_session, waiter).id)
        session = db.new_session()
        try:
            seen.append(in_use(session, "class-full-step/"))
        finally:
            session.close()
        _run(_current(geneva_session, other_tenant).id)

    during.append(meanwhile)
    _run(_current(geneva_session, holder).id)
    assert seen == [0]
    deferred = _current(geneva_session, waiter)
    assert (deferred.step_name, deferred.state, deferred.started_at) == (
        "limited",
        "scheduled",
        None,
    )
    assert deferred.deferred_on == "class-full/acme"
    assert _states(geneva_session, other_tenant) == [
        ("free", "completed", "success"),
        ("limited", "completed", "success"),
    ]
    # The holder's end freed acme's class slot and woke the waiter: it runs now.
    assert deferred.scheduled_for <= utcnow()
    _run(deferred.id)
    assert _states(geneva_session, waiter)[-1] == ("limited", "completed", "success")


def test_a_lower_limit_applies_to_executions_already_deferred(geneva_session: Any) -> None:
    class Resizable(Workflow):
        concurrency_limit = ConcurrencyLimit("resizable", limit=2)

        @step
        def go(self) -> None:
            _body(self)

    try:
        holder = _create(geneva_session, Resizable)
        waiter = _create(geneva_session, Resizable)

        def meanwhile(wf: Any) -> None:
            if wf.id == holder.id:
                Resizable.concurrency_limit = ConcurrencyLimit("resizable", limit=1)
                _run(_current(geneva_session, waiter).id)

        during.append(meanwhile)
        _run(_current(geneva_session, holder).id)
        assert _current(geneva_session, waiter).deferred_on == "resizable/"
    finally:
        unregister("Resizable")


# --- rate --------------------------------------------------------------------------------------


def test_rate_limit_admits_limit_starts_per_window_and_schedules_the_rest(
    geneva_session: Any,
) -> None:
    calls = [_create(geneva_session, ShopCall, "acme") for _ in range(4)]
    other = _create(geneva_session, ShopCall, "globex")
    for workflow in [*calls, other]:
        _run(_current(geneva_session, workflow).id)
    done = [wf for wf in calls if _states(geneva_session, wf)[0][1] == "completed"]
    assert done == calls[:2]
    assert _states(geneva_session, other) == [("call_api", "completed", "success")]
    third, fourth = (executions(geneva_session, wf)[0] for wf in calls[2:])
    starts = sorted(executions(geneva_session, wf)[0].started_at for wf in calls[:2])
    # Each waits for the token its turn gets back: the first start's, then the second's.
    assert third.deferred_on == "shop-api/acme" and fourth.deferred_on == "shop-api/acme"
    assert abs((third.scheduled_for - (starts[0] + timedelta(hours=1))).total_seconds()) < 1
    assert abs((fourth.scheduled_for - (starts[1] + timedelta(hours=1))).total_seconds()) < 1
    line = calls[2].why_waiting()
    assert line.startswith("waiting for a token of `shop-api` [acme]: next start in ")
    # Run early (a stray message), it is deferred again, not run.
    _run(third.id)
    assert executions(geneva_session, calls[2])[0].state == "scheduled"
    # An hour later the window has moved on: it starts.
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id.in_([executions(geneva_session, wf)[0].id for wf in calls[:2]]))
        .values(started_at=utcnow() - timedelta(hours=2))
    )
    geneva_session.commit()
    _run(third.id)
    assert executions(geneva_session, calls[2])[0].state == "completed"


# --- races ---------------------------------------------------------------------------------------


def _race(session: Any, ids: list[int], *, rounds: int = 12, until_due: bool = False) -> None:
    """Round after round, run every one of ``ids`` still scheduled at once: one thread each,
    a worker on its own session and connection, released together by a barrier. With
    ``until_due``, each round first waits until the earliest of them is due (rate limits)."""
    errors: list[BaseException] = []

    def worker(barrier: threading.Barrier, execution_id: int) -> None:
        try:
            barrier.wait(30)
            _run(execution_id)
        except BaseException as error:
            errors.append(error)

    for _round in range(rounds):
        session.commit()  # a fresh snapshot (and nothing held while the racers write)
        # The suite's session keeps its objects over a commit (expire_on_commit=False): without
        # this, every round saw the first round's states and due times, re-ran the finished
        # ones and never waited for a token, so the rate race ran out of rounds on a fast run.
        session.expire_all()
        pending = [session.get(StepExecution, i) for i in ids]
        pending = [e for e in pending if e is not None and e.state == "scheduled"]
        if not pending:
            return
        if until_due:
            wait = (min(e.scheduled_for for e in pending) - utcnow()).total_seconds()
            time.sleep(min(max(wait, 0.0), 5.0))
        barrier = threading.Barrier(len(pending))
        threads = [threading.Thread(target=worker, args=(barrier, e.id)) for e in pending]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "a racer hung (deadlock?)"
        assert [e for e in errors if not db.is_deadlock(e)] == []
        errors.clear()
    session.commit()


def _counting(running: dict[str, int], guard: threading.Lock) -> Callable[[Any], None]:
    """A step body that counts how many run at once (``now``, ``max``) and in all (``ran``)."""

    def hold(_wf: Any) -> None:
        with guard:
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
            running["ran"] += 1
        time.sleep(0.2)  # overlap, so an unenforced limit would show
        with guard:
            running["now"] -= 1

    return hold


def _final_states(session: Any, ids: list[int]) -> list[str]:
    return sorted(session.scalars(select(StepExecution.state).where(StepExecution.id.in_(ids))))


def _race_twelve(
    session: Any, cls: type[Workflow], **race: Any
) -> tuple[list[int], dict[str, int]]:
    """Twelve workflows of ``cls`` (key "acme") raced by :func:`_race` until each completed,
    each body run exactly once (a deferral is no attempt): their executions' ids and the
    bodies' counts (``max``: the most running at once)."""
    running = {"now": 0, "max": 0, "ran": 0}
    during.append(_counting(running, threading.Lock()))
    workflows = [_create(session, cls, "acme") for _ in range(12)]
    ids = [_current(session, wf).id for wf in workflows]
    _race(session, ids, **race)
    assert _final_states(session, ids) == ["completed"] * 12
    assert running["ran"] == 12
    return ids, running


def test_racing_workers_never_exceed_the_limit(geneva_session: Any) -> None:
    """Twelve threads, each a worker on its own connection, race for two slots."""

    class Raced(Workflow):
        concurrency_limit = ConcurrencyLimit("raced", limit=2, key=_status)

        @step
        def go(self) -> None:
            _body(self)

    try:
        _ids, running = _race_twelve(geneva_session, Raced)
        assert running["max"] <= 2
    finally:
        unregister("Raced")


def _most_starts_in_a_window(starts: list[Any], per: timedelta) -> int:
    """The most starts in any window ``[start, start + per)`` (the engine's: a start leaves
    the window exactly ``per`` after it)."""
    starts = sorted(starts)
    return max(
        sum(1 for other in starts[i:] if other < first + per) for i, first in enumerate(starts)
    )


def test_racing_workers_never_exceed_a_rate_limit(geneva_session: Any) -> None:
    """Twelve threads, each a worker on its own connection, race for two starts a second;
    the deferred ones race again as their tokens come due, until every one has run."""
    per = timedelta(seconds=1)

    class RateRaced(Workflow):
        @step(rate_limit=RateLimit("rate-raced", limit=2, per=per, key=_status))
        def go(self) -> None:
            _body(self)

    try:
        ids, _running = _race_twelve(geneva_session, RateRaced, rounds=60, until_due=True)
        starts = list(
            geneva_session.scalars(
                select(StepExecution.started_at).where(StepExecution.id.in_(ids))
            )
        )
        assert _most_starts_in_a_window(starts, per) <= 2, sorted(starts)
    finally:
        unregister("RateRaced")
