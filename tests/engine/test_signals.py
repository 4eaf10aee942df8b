"""Signals: the sender side — signal(), dedup, atomicity, payloads (docs/MANUAL.md, "Signals
and webhooks")."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from sqlalchemy import event, func, select

from geneva_drive import SignalMatcher, Workflow, db, settings, step
from geneva_drive.dialects import dialect_for
from geneva_drive.errors import SignalPayloadTooLargeError, WorkflowNotOngoing
from geneva_drive.models import Signal, StepExecution
from geneva_drive.testing import perform_next_step, speedrun_workflow
from tests.engine.helpers import make_order


def signal_rows(session, wf=None):
    session.flush()
    query = select(Signal).order_by(Signal.id)
    if wf is not None:
        query = query.where(Signal.workflow_id == wf.id)
    return list(session.scalars(query))


def count_signals(session):
    return session.scalar(select(func.count()).select_from(Signal))


class GoFlow(Workflow):
    @step
    def first(self):
        pass

    @step(wait_for="go")
    def second(self):
        self.hero.status = f"got {self.received_signal.payload!r}"


class ParkFlow(Workflow):
    @step(wait_for="go")
    def wait_here(self):
        pass

    @step
    def after(self):
        pass


def parked(session, hero):
    """A ParkFlow whose first step is parked, committed."""
    wf = ParkFlow.create(hero=hero)
    perform_next_step(wf)
    execution = wf.current_execution
    assert execution.state == "waiting"
    return wf, execution


# --- the basic contract ---------------------------------------------------------------------


def test_signal_returns_a_pending_row(order, geneva_session):
    wf = GoFlow.create(hero=order)
    signal = wf.signal("go", payload={"amount_cents": 500}, idempotency_key=42)
    assert isinstance(signal, Signal)
    assert signal.id is not None
    assert signal.workflow_id == wf.id
    assert signal.name == "go"
    assert signal.idempotency_key == "42"  # coerced to a string
    assert signal.state == "pending"
    assert (signal.claimed, signal.consumed) == (0, 0)
    assert not signal.is_claimed and not signal.is_consumed
    assert signal.claimed_at is None and signal.consumed_at is None
    assert signal.payload == {"amount_cents": 500}
    assert signal.duplicate_delivery is False
    assert signal.created_at is not None


def test_default_payload_reads_back_as_an_empty_dict_and_names_are_strings(order, geneva_session):
    wf = GoFlow.create(hero=order)
    signal = wf.signal("go")
    geneva_session.commit()
    geneva_session.expire_all()
    assert signal.payload == {}
    assert signal.idempotency_key is None

    class Name:
        def __str__(self):
            return "from-object"

    assert wf.signal(Name()).name == "from-object"


def test_signal_is_a_model_with_counters_not_state_predicates(geneva_session):
    assert not hasattr(Signal, "is_pending")
    assert not hasattr(Signal, "pending")
    fresh = Signal(name="x", state="claimed", claimed=0, consumed=0)
    assert fresh.is_claimed is False  # the predicates read the counters, not the state
    fresh.claimed = 2
    assert fresh.is_claimed is True


@pytest.mark.parametrize("name", [None, "", "   "])
def test_blank_name_is_refused_and_nothing_is_written(order, geneva_session, name):
    wf = GoFlow.create(hero=order)
    with pytest.raises(ValueError, match="signal\\(\\) requires a signal name"):
        wf.signal(name)
    assert count_signals(geneva_session) == 0


def test_unknown_options_are_refused_and_nothing_is_written(order, geneva_session):
    wf = GoFlow.create(hero=order)
    with pytest.raises(TypeError, match="Unknown options passed to signal\\(\\): retries, timeout"):
        wf.signal("go", timeout=5, retries=2)
    assert count_signals(geneva_session) == 0


# --- deduplication ---------------------------------------------------------------------------


def test_same_key_returns_the_first_row_flagged_duplicate(order, geneva_session):
    wf = GoFlow.create(hero=order)
    first = wf.signal("go", payload={"v": 1}, idempotency_key="evt-1")
    again = wf.signal("go", payload={"v": 2}, idempotency_key="evt-1")
    assert again.id == first.id
    assert again.duplicate_delivery is True
    assert again.payload == {"v": 1}  # first payload wins
    assert len(signal_rows(geneva_session, wf)) == 1
    # a fresh load of the row is not flagged
    geneva_session.commit()
    other = db.SessionFactory()
    try:
        assert other.get(Signal, first.id).duplicate_delivery is False
    finally:
        other.close()


def test_dedup_is_per_workflow_name_and_key(order, geneva_session):
    wf = GoFlow.create(hero=order)
    other_wf = GoFlow.create(hero=make_order(geneva_session))
    a = wf.signal("go", idempotency_key="k")
    b = wf.signal("stop", idempotency_key="k")
    c = other_wf.signal("go", idempotency_key="k")
    assert len({a.id, b.id, c.id}) == 3
    assert not (a.duplicate_delivery or b.duplicate_delivery or c.duplicate_delivery)
    # no key: never deduplicated
    d = wf.signal("go")
    e = wf.signal("go")
    assert d.id != e.id
    assert not e.duplicate_delivery
    assert len(signal_rows(geneva_session, wf)) == 4


def test_redelivery_does_not_dispatch(order, geneva_session, geneva_transport):
    wf, execution = parked(geneva_session, order)
    first = wf.signal("go", idempotency_key="evt")
    geneva_session.commit()
    geneva_session.refresh(execution)
    assert execution.state == "scheduled"
    before = (execution.scheduled_for, execution.job_id, execution.signal_id)
    geneva_transport.clear()
    again = wf.signal("go", idempotency_key="evt")
    geneva_session.commit()
    assert again.duplicate_delivery and again.id == first.id
    geneva_session.refresh(execution)
    assert (execution.scheduled_for, execution.job_id, execution.signal_id) == before
    assert geneva_transport.messages == []
    geneva_session.refresh(first)
    assert first.claimed == 1


def test_a_unique_violation_on_insert_returns_the_existing_row(order, geneva_session):
    """The unique index is the last word on dedup: when the pre-check misses the first row,
    the insert fails inside its own savepoint and the existing row is returned."""
    from geneva_drive import signals as signals_module

    wf = GoFlow.create(hero=order)
    first = wf.signal("go", payload={"winner": True}, idempotency_key="race")
    geneva_session.commit()
    real_find = signals_module._find
    misses = {"n": 1}

    def missing_once(session, workflow, name, key):
        if misses["n"]:
            misses["n"] -= 1
            return None
        return real_find(session, workflow, name, key)

    signals_module._find = missing_once
    try:
        result = wf.signal("go", payload={"winner": False}, idempotency_key="race")
    finally:
        signals_module._find = real_find
    assert misses["n"] == 0
    assert result.duplicate_delivery is True
    assert result.id == first.id
    assert result.payload == {"winner": True}
    geneva_session.commit()  # the enclosing transaction is still usable
    assert len(signal_rows(geneva_session, wf)) == 1


# --- finished, canceled and paused workflows ------------------------------------------------


@pytest.mark.parametrize("terminal", ["finished", "canceled"])
def test_terminal_workflows_refuse_new_signals(order, geneva_session, terminal):
    wf = GoFlow.create(hero=order)
    if terminal == "canceled":
        wf.cancel()
    else:
        wf.signal("go")
        speedrun_workflow(wf)
    assert wf.state == terminal
    before = count_signals(geneva_session)
    with pytest.raises(
        WorkflowNotOngoing, match=f'Cannot deliver signal "late" to a {terminal} workflow'
    ):
        wf.signal("late")
    with pytest.raises(WorkflowNotOngoing):
        wf.signal("late", idempotency_key="never-seen")
    assert count_signals(geneva_session) == before


def test_a_workflow_housekeeping_deleted_after_it_was_loaded_refuses_signals(order, geneva_session):
    wf = GoFlow.create(hero=order)
    wf.cancel()
    geneva_session.commit()
    # Housekeeping deletes it in its own transaction; the caller still holds the loaded object.
    with db.transaction() as other:
        other.execute(Workflow.__table__.delete().where(Workflow.__table__.c.id == wf.id))
    with pytest.raises(WorkflowNotOngoing, match="to a workflow housekeeping deleted"):
        wf.signal("late", idempotency_key="webhook-retry")
    geneva_session.rollback()
    assert count_signals(geneva_session) == 0


def test_redelivery_of_the_event_that_finished_a_workflow_is_not_an_error(order, geneva_session):
    wf = GoFlow.create(hero=order)
    original = wf.signal("go", payload={"n": 1}, idempotency_key="evt-9")
    speedrun_workflow(wf)
    assert wf.state == "finished"
    again = wf.signal("go", payload={"n": 2}, idempotency_key="evt-9")
    assert again.id == original.id
    assert again.duplicate_delivery is True
    assert again.payload == {"n": 1}
    # the same key under another name is a new event
    with pytest.raises(WorkflowNotOngoing):
        wf.signal("other", idempotency_key="evt-9")


def test_a_paused_workflow_buffers_and_resume_delivers(order, geneva_session, geneva_transport):
    wf, execution = parked(geneva_session, order)
    wf.pause()
    geneva_session.commit()
    geneva_transport.clear()
    signal = wf.signal("go", payload={"ok": True})
    geneva_session.commit()
    assert signal.state == "pending"
    geneva_session.refresh(execution)
    assert execution.state == "waiting"
    assert execution.signal_id is None
    assert geneva_transport.messages == []

    woken = wf.resume()
    geneva_session.commit()
    assert woken.id == execution.id
    geneva_session.refresh(execution)
    geneva_session.refresh(signal)
    assert execution.state == "scheduled"
    assert execution.signal_id == signal.id
    assert execution.waiting_since is None
    assert signal.state == "claimed" and signal.claimed == 1
    assert geneva_transport.execution_ids == [execution.id]
    speedrun_workflow(wf)
    geneva_session.refresh(signal)
    assert signal.state == "consumed"
    assert wf.state == "finished"


def test_resume_with_a_parked_execution_and_no_matching_signal_stays_parked(
    order, geneva_session, geneva_transport
):
    wf, execution = parked(geneva_session, order)
    wf.pause()
    wf.signal("something-else")
    geneva_session.commit()
    geneva_transport.clear()
    assert wf.resume().id == execution.id
    geneva_session.commit()
    geneva_session.refresh(execution)
    assert execution.state == "waiting"
    assert wf.state == "ready"
    assert geneva_transport.messages == []


# --- payloads --------------------------------------------------------------------------------


def test_payload_round_trips_dates_decimals_uuids(order, geneva_session):
    payload = {
        "at": datetime(2026, 5, 1, 10, 30, 0, tzinfo=UTC),
        "on": date(2026, 5, 1),
        "amount": Decimal("19.99"),
        "id": uuid.UUID(int=99),
        "tags": ["a", 1, None, True, 2.5],
        "nested": {"when": date(2020, 2, 29)},
    }
    wf = GoFlow.create(hero=order)
    signal = wf.signal("go", payload=payload)
    geneva_session.commit()
    other = db.SessionFactory()
    try:
        loaded = other.get(Signal, signal.id)
        assert loaded.payload == payload
        assert type(loaded.payload["amount"]) is Decimal
        assert type(loaded.payload["id"]) is uuid.UUID
        assert type(loaded.payload["on"]) is date
        assert loaded.payload["at"].tzinfo is not None
    finally:
        other.close()


def test_non_mapping_payloads_come_back_as_they_are(order, geneva_session):
    wf = GoFlow.create(hero=order)
    assert wf.signal("go", payload="just text").payload == "just text"
    assert wf.signal("go", payload=[1, 2]).payload == [1, 2]


def test_unserializable_payload_is_refused_before_anything_is_written(order, geneva_session):
    wf = GoFlow.create(hero=order)
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        wf.signal("go", payload={"x": object()})
    assert count_signals(geneva_session) == 0


def test_payload_size_limit_equal_is_allowed_over_is_refused(order, geneva_session):
    settings.max_signal_payload_size = 20
    wf = GoFlow.create(hero=order)
    exactly = {"k": "x" * 12}  # {"k":"xxxxxxxxxxxx"} = 20 bytes
    assert wf.signal("go", payload=exactly).payload == exactly
    with pytest.raises(SignalPayloadTooLargeError) as raised:
        wf.signal("go", payload={"k": "x" * 13})
    message = str(raised.value)
    assert "Serialized signal payload is 21 bytes" in message
    assert "max_signal_payload_size (20 bytes)" in message
    assert "write what matters onto the hero instead" in message
    assert count_signals(geneva_session) == 1
    # UTF-8 bytes are counted, not characters
    with pytest.raises(SignalPayloadTooLargeError, match="max_signal_payload_size"):
        wf.signal("go", payload={"k": "é" * 7})


def test_payload_size_limit_none_disables_and_default_is_128_kib(order, geneva_session):
    assert settings.max_signal_payload_size == 128 * 1024
    wf = GoFlow.create(hero=order)
    with pytest.raises(SignalPayloadTooLargeError):
        wf.signal("go", payload="y" * (128 * 1024))
    settings.max_signal_payload_size = None
    big = wf.signal("go", payload="y" * 200_000)
    assert len(big.payload) == 200_000


# --- atomicity -------------------------------------------------------------------------------


class Exploding:
    name = "boom"

    def __init__(self):
        self.armed = False

    def matches(self, signal):
        if self.armed:
            raise RuntimeError("matcher exploded")
        return signal.name == "boom"


EXPLODING = Exploding()


class ExplodingFlow(Workflow):
    @step(wait_for=EXPLODING)
    def wait_here(self):
        pass


def test_a_matcher_raising_during_signal_leaves_nothing_behind(
    order, geneva_session, geneva_transport
):
    wf = ExplodingFlow.create(hero=order)
    perform_next_step(wf)
    parked_execution = wf.current_execution
    before = (
        parked_execution.state,
        parked_execution.signal_id,
        parked_execution.scheduled_for,
        parked_execution.waiting_since,
    )
    # the caller's own work in the same transaction survives the failed delivery
    order.status = "caller-work"
    geneva_transport.clear()
    EXPLODING.armed = True
    try:
        with pytest.raises(RuntimeError, match="matcher exploded"):
            wf.signal("boom", payload={"a": 1})
    finally:
        EXPLODING.armed = False
    geneva_session.commit()
    assert count_signals(geneva_session) == 0
    geneva_session.refresh(parked_execution)
    after = (
        parked_execution.state,
        parked_execution.signal_id,
        parked_execution.scheduled_for,
        parked_execution.waiting_since,
    )
    assert after == before
    assert geneva_transport.messages == []
    geneva_session.refresh(order)
    assert order.status == "caller-work"
    # and a retry by the sender works
    signal = wf.signal("boom")
    geneva_session.commit()
    geneva_session.refresh(parked_execution)
    assert parked_execution.state == "scheduled"
    assert parked_execution.signal_id == signal.id
    assert geneva_transport.execution_ids == [parked_execution.id]


def test_a_failing_inline_enqueue_rolls_the_delivery_back(order, geneva_session, geneva_transport):
    from geneva_drive import with_inline_enqueue

    wf, execution = parked(geneva_session, order)

    def refuse(message):
        raise ConnectionError("broker down")

    geneva_transport.send = refuse
    with with_inline_enqueue(), pytest.raises(ConnectionError):
        wf.signal("go")
    geneva_session.commit()
    assert count_signals(geneva_session) == 0
    geneva_session.refresh(execution)
    assert execution.state == "waiting" and execution.signal_id is None


def test_the_callers_rollback_undoes_the_delivery(order, geneva_session, geneva_transport):
    wf, execution = parked(geneva_session, order)
    geneva_transport.clear()
    wf.signal("go")
    geneva_session.rollback()
    assert count_signals(geneva_session) == 0
    geneva_session.refresh(execution)
    assert execution.state == "waiting"
    assert geneva_transport.messages == []


def test_the_workflow_row_is_locked_before_the_insert(order, geneva_session, geneva_database):
    wf = GoFlow.create(hero=order)
    geneva_session.commit()
    statements = []

    def record(conn, cursor, statement, params, context, executemany):
        statements.append(" ".join(statement.split()))

    event.listen(geneva_database.engine, "before_cursor_execute", record)
    try:
        wf.signal("go")
    finally:
        event.remove(geneva_database.engine, "before_cursor_execute", record)
    lock = next(
        i
        for i, s in enumerate(statements)
        if s.startswith("SELECT") and "FROM geneva_drive_workflows" in s
    )
    insert = next(
        i for i, s in enumerate(statements) if s.startswith("INSERT INTO geneva_drive_signals")
    )
    assert lock < insert
    if dialect_for(geneva_session).row_locks:
        assert "FOR UPDATE" in statements[lock]
    else:
        assert any(s.startswith("BEGIN IMMEDIATE") for s in statements[:lock])
    assert not any(s.startswith("COMMIT") for s in statements[lock:insert])


def test_signal_on_a_workflow_whose_class_is_gone(order, geneva_session):
    from geneva_drive.workflow import unregister

    class GoneFlow(Workflow):
        @step(wait_for="go")
        def wait_here(self):
            pass

    wf = GoneFlow.create(hero=order)
    perform_next_step(wf)
    workflow_id = wf.id
    geneva_session.commit()
    unregister("GoneFlow")
    geneva_session.expunge_all()
    plain = geneva_session.get(Workflow, workflow_id)
    assert type(plain) is Workflow
    signal = plain.signal("go")
    geneva_session.commit()
    assert signal.state == "pending"
    execution = geneva_session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == workflow_id)
    ).one()
    assert execution.state == "waiting"


def test_deleting_a_workflow_deletes_its_signals(order, geneva_session):
    wf = GoFlow.create(hero=order)
    wf.signal("go")
    wf.signal("go")
    geneva_session.commit()
    geneva_session.delete(wf)
    geneva_session.commit()
    assert count_signals(geneva_session) == 0


# --- matchers --------------------------------------------------------------------------------


def test_signal_matcher_basics():
    with pytest.raises(ValueError, match="SignalMatcher needs a signal name"):
        SignalMatcher("")
    with pytest.raises(ValueError):
        SignalMatcher(None)
    with pytest.raises(TypeError, match="where= must be callable"):
        SignalMatcher("go", where=42)
    plain = SignalMatcher("go")
    narrowed = SignalMatcher("go", where=lambda wf, payload: payload["n"] > 1)
    assert str(plain) == "go"
    assert str(narrowed) == "go (narrowed by payload)"
    assert "go" in repr(narrowed)

    class Fake:
        def __init__(self, name, payload):
            self.name, self.payload, self.workflow = name, payload, None

    assert plain.matches(Fake("go", {}))
    assert not plain.matches(Fake("stop", {}))
    assert narrowed.matches(Fake("go", {"n": 2}))
    assert not narrowed.matches(Fake("go", {"n": 1}))
    assert not narrowed.matches(Fake("stop", {"n": 5}))
