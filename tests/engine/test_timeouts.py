"""Time-bounded waits (docs/MANUAL.md, "Time-bounded waits"): timeout= and on_timeout= on
steps that wait for a signal.

Each action through the dispatcher's sweep (``dispatch_due(now=…)``) and the test helper
(``expire_wait``); a signal before the deadline wins, one after it is buffered; paused
workflows do not time out and ``resume()`` past the deadline fires at once; a deploy that adds
``timeout=`` to a step with parked executions starts their clock at its first sweep.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, dispatch, settings, step
from geneva_drive.celery import dispatch_due_task
from geneva_drive.dispatch import dispatch_due, fire_timeouts, run_dispatcher
from geneva_drive.errors import StepConfigurationError, WorkflowNotOngoing
from geneva_drive.instrumentation import wait_timed_out
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.registry import registered_workflows
from geneva_drive.testing import (
    assert_waiting_for_signal,
    expire_wait,
    perform_next_step,
    speedrun_workflow,
)
from geneva_drive.workflow import unregister
from tests.engine.helpers import assert_close, create_workflow, executions, summary

THREE_DAYS = timedelta(days=3)
seen: list[tuple[object, bool]] = []


def _flow(action: str) -> type[Workflow]:
    """A reserve → capture (waits for payment_confirmed, 3 days) → ship workflow."""

    def reserve(self) -> None:
        pass

    def capture(self) -> None:
        seen.append((self.received_signal, self.wait_timed_out))

    def ship(self) -> None:
        seen.append(("ship", self.wait_timed_out))

    body = {
        "reserve": step(reserve),
        "capture": step(wait_for="payment_confirmed", timeout=THREE_DAYS, on_timeout=action)(
            capture
        ),
        "ship": step(ship),
    }
    return type(f"TimeoutFlow_{action}", (Workflow,), body)


RunFlow = _flow("run")
SkipFlow = _flow("skip")
CancelFlow = _flow("cancel")
PauseFlow = _flow("pause")
FLOWS = {"run": RunFlow, "skip": SkipFlow, "cancel": CancelFlow, "pause": PauseFlow}


@pytest.fixture(autouse=True)
def _clear_seen():
    seen.clear()
    yield
    seen.clear()


@pytest.fixture
def fired():
    """Every wait_timed_out event of the test: (execution id, action)."""
    events: list[tuple[int, str]] = []

    def receiver(sender, **payload):
        events.append((payload["execution_id"], payload["action"]))

    wait_timed_out.connect(receiver)
    yield events
    wait_timed_out.disconnect(receiver)


def _parked(session, cls):
    """A workflow of ``cls`` parked at ``capture``, and its parked execution."""
    workflow = create_workflow(session, cls)
    perform_next_step(workflow)  # reserve
    perform_next_step(workflow)  # capture parks
    assert_waiting_for_signal(workflow, "payment_confirmed")
    parked = executions(session, workflow, "capture")[-1]
    return workflow, parked


# --- definition ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout": 60}, "does not wait for anything"),
        ({"wait": 5, "timeout": 60, "on_timeout": "skip"}, "does not wait for anything"),
        ({"wait_for": "go", "timeout": 60}, "no on_timeout="),
        ({"wait_for": "go", "on_timeout": "skip"}, "no timeout="),
        ({"wait_for": "go", "timeout": 60, "on_timeout": "retry"}, '"run", "skip", "cancel"'),
        ({"wait_for": "go", "timeout": 60, "on_timeout": None}, "no on_timeout="),
        ({"wait_for": "go", "timeout": 0, "on_timeout": "skip"}, "must be positive"),
        ({"wait_for": "go", "timeout": -1, "on_timeout": "skip"}, "must be positive"),
        ({"wait_for": "go", "timeout": "3 days", "on_timeout": "skip"}, "timedelta or seconds"),
        ({"wait_for": "go", "timeout": True, "on_timeout": "skip"}, "timedelta or seconds"),
        ({"wait_for": "go", "timeout": float("nan"), "on_timeout": "skip"}, "finite"),
        ({"wait_for": "go", "timeout": float("inf"), "on_timeout": "skip"}, "finite"),
    ],
)
def test_bad_timeout_options_refuse_the_class_when_it_is_defined(options, message):
    with pytest.raises(StepConfigurationError, match=message) as raised:

        class BadTimeout(Workflow):
            @step(**options)
            def gated(self) -> None: ...

    assert "gated" in str(raised.value) and "BadTimeout" in str(raised.value)
    assert "BadTimeout" not in registered_workflows()


def test_timeout_takes_a_timedelta_or_seconds():
    class SecondsTimeout(Workflow):
        @step(wait_for="go", timeout=90, on_timeout="cancel")
        def gated(self) -> None: ...

    try:
        definition = SecondsTimeout.steps.named("gated")
        assert definition.timeout == timedelta(seconds=90)
        assert definition.on_timeout == "cancel"
    finally:
        unregister("SecondsTimeout")


# --- parking ---------------------------------------------------------------------------------


def test_the_clock_starts_when_the_execution_parks(geneva_session):
    workflow, parked = _parked(geneva_session, CancelFlow)
    assert parked.state == "waiting"
    assert parked.timeout_at == parked.waiting_since + THREE_DAYS
    assert parked.timed_out_at is None
    reserve = executions(geneva_session, workflow, "reserve")[0]
    assert reserve.timeout_at is None  # steps without a time-out store none


def test_nothing_fires_before_the_deadline(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    dispatch_due(parked.timeout_at - timedelta(seconds=1))
    assert fired == []
    geneva_session.refresh(workflow)
    assert workflow.state == "ready"
    assert executions(geneva_session, workflow, "capture")[-1].state == "waiting"


# --- the four actions ------------------------------------------------------------------------


def test_on_timeout_run_runs_the_body_without_a_signal(geneva_session, fired):
    workflow, parked = _parked(geneva_session, RunFlow)
    dispatch_due(parked.timeout_at)
    assert fired == [(parked.id, "run")]
    woken = executions(geneva_session, workflow, "capture")[-1]
    assert woken.id == parked.id and woken.state == "scheduled"
    assert woken.timed_out_at is not None
    perform_next_step(workflow)  # capture runs
    assert seen == [(None, True)]
    perform_next_step(workflow)  # ship: an ordinary step again
    assert seen == [(None, True), ("ship", False)]
    assert summary(geneva_session, workflow) == [
        ("reserve", "completed", "success"),
        ("capture", "completed", "timed_out"),
        ("ship", "completed", "success"),
    ]
    geneva_session.refresh(workflow)
    assert workflow.state == "finished"


def test_on_timeout_skip_moves_on_to_the_next_step(geneva_session, fired):
    workflow, parked = _parked(geneva_session, SkipFlow)
    dispatch_due(parked.timeout_at + timedelta(minutes=1))
    assert fired == [(parked.id, "skip")]
    speedrun_workflow(workflow)
    assert summary(geneva_session, workflow) == [
        ("reserve", "completed", "success"),
        ("capture", "skipped", "timed_out"),
        ("ship", "completed", "success"),
    ]
    assert seen == [("ship", False)]  # the capture body never ran
    assert workflow.state == "finished"


def test_on_timeout_cancel_cancels_the_execution_and_the_workflow(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    dispatch_due(parked.timeout_at)
    assert fired == [(parked.id, "cancel")]
    geneva_session.refresh(workflow)
    assert workflow.state == "canceled"
    closed = executions(geneva_session, workflow, "capture")[-1]
    assert (closed.state, closed.outcome) == ("canceled", "timed_out")
    assert closed.finished_at is not None and closed.timed_out_at is not None
    # The ending says why (docs/MANUAL.md, "Time-bounded waits": What operators see).
    assert workflow.why_waiting() == (
        "timed out waiting for `payment_confirmed` after 3 d (then cancel)"
    )
    with pytest.raises(WorkflowNotOngoing):  # a canceled workflow takes no signal
        workflow.signal("payment_confirmed")


def test_on_timeout_pause_pauses_saying_why_and_resume_parks_again(geneva_session, fired):
    workflow, parked = _parked(geneva_session, PauseFlow)
    dispatch_due(parked.timeout_at)
    assert fired == [(parked.id, "pause")]
    geneva_session.refresh(workflow)
    assert workflow.state == "paused"
    closed = executions(geneva_session, workflow, "capture")[-1]
    assert (closed.state, closed.outcome) == ("canceled", "timed_out")
    assert workflow.why_waiting().startswith(
        "paused: the wait for signal `payment_confirmed` in `capture` timed out"
    )

    workflow.resume()
    geneva_session.commit()
    perform_next_step(workflow)  # capture again: parks with a fresh deadline
    again = executions(geneva_session, workflow, "capture")[-1]
    assert again.id != parked.id and again.state == "waiting"
    assert again.timeout_at == again.waiting_since + THREE_DAYS
    assert_close(again.timeout_at, utcnow() + THREE_DAYS)
    workflow.signal("payment_confirmed", payload={"amount_cents": 100})
    geneva_session.commit()
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
    assert seen[0][1] is False and seen[0][0] is not None  # this time the signal came


def test_each_time_out_fires_once(geneva_session, fired):
    _, parked = _parked(geneva_session, SkipFlow)
    dispatch_due(parked.timeout_at)
    dispatch_due(parked.timeout_at + timedelta(days=1))
    fire_timeouts(parked.timeout_at + timedelta(days=2))
    assert fired == [(parked.id, "skip")]


def test_the_sweep_covers_more_time_outs_than_one_batch(geneva_session, fired):
    parked = [_parked(geneva_session, CancelFlow)[1] for _ in range(5)]
    fire_timeouts(utcnow() + THREE_DAYS + timedelta(minutes=1), batch_size=2)
    assert sorted(fired) == sorted((p.id, "cancel") for p in parked)


# --- signals and the deadline -----------------------------------------------------------------


def test_a_signal_before_the_deadline_wins(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.signal("payment_confirmed", payload={"amount_cents": 500})
    geneva_session.commit()
    dispatch_due(parked.timeout_at + timedelta(days=1))
    assert fired == []
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
    assert summary(geneva_session, workflow)[1] == ("capture", "completed", "success")


def test_a_signal_after_the_time_out_is_buffered(geneva_session, fired):
    workflow, parked = _parked(geneva_session, RunFlow)
    dispatch_due(parked.timeout_at)
    late = workflow.signal("payment_confirmed", payload={"amount_cents": 500})
    geneva_session.commit()
    assert late.state == "pending"
    perform_next_step(workflow)  # the timed-out body runs without the late signal
    assert seen == [(None, True)]
    geneva_session.refresh(late)
    assert (late.state, late.claimed) == ("pending", 0)


def test_a_late_signal_after_skip_stays_pending(geneva_session):
    workflow, parked = _parked(geneva_session, SkipFlow)
    dispatch_due(parked.timeout_at)
    late = workflow.signal("payment_confirmed")
    geneva_session.commit()
    speedrun_workflow(workflow)
    geneva_session.refresh(late)
    assert late.state == "pending"


# --- pause and resume around the deadline -----------------------------------------------------


def test_a_paused_workflow_does_not_time_out(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.pause()
    geneva_session.commit()
    dispatch_due(parked.timeout_at + timedelta(days=30))
    assert fired == []
    geneva_session.refresh(workflow)
    assert workflow.state == "paused"
    assert executions(geneva_session, workflow, "capture")[-1].state == "waiting"


def test_resume_past_the_deadline_fires_at_once(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.pause()
    geneva_session.commit()
    _move_deadline(geneva_session, parked, utcnow() - timedelta(seconds=1))
    workflow.resume()
    geneva_session.commit()
    assert fired == [(parked.id, "cancel")]
    geneva_session.refresh(workflow)
    assert workflow.state == "canceled"


def test_resume_before_the_deadline_parks_on(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.pause()
    geneva_session.commit()
    workflow.resume()
    geneva_session.commit()
    assert fired == []
    current = executions(geneva_session, workflow, "capture")[-1]
    assert (current.id, current.state, current.timeout_at) == (
        parked.id,
        "waiting",
        parked.timeout_at,
    )
    dispatch_due(parked.timeout_at)  # the deadline still counts once resumed
    assert fired == [(parked.id, "cancel")]


def test_resume_past_the_deadline_lets_a_signal_that_came_first_win(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.pause()
    geneva_session.commit()
    workflow.signal("payment_confirmed")  # buffered while paused, before the deadline
    geneva_session.commit()
    _move_deadline(geneva_session, parked, utcnow() + timedelta(milliseconds=1))
    time.sleep(0.01)  # the deadline passes while the workflow is paused
    workflow.resume()
    geneva_session.commit()
    assert fired == []
    speedrun_workflow(workflow)
    assert workflow.state == "finished"


def test_resume_past_the_deadline_with_a_signal_that_came_later_fires(geneva_session, fired):
    workflow, parked = _parked(geneva_session, SkipFlow)
    workflow.pause()
    geneva_session.commit()
    _move_deadline(geneva_session, parked, utcnow() - timedelta(minutes=5))
    late = workflow.signal("payment_confirmed")
    geneva_session.commit()
    workflow.resume()
    geneva_session.commit()
    assert fired == [(parked.id, "skip")]
    geneva_session.refresh(late)
    assert late.state == "pending"


def _move_deadline(session, execution, when):
    row = session.get(StepExecution, execution.id)
    row.timeout_at = when
    session.commit()


# --- the test helper -------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["run", "skip", "cancel", "pause"])
def test_expire_wait_fires_the_time_out_now(geneva_session, fired, action):
    workflow, parked = _parked(geneva_session, FLOWS[action])
    expire_wait(workflow)
    assert fired == [(parked.id, action)]
    expected_state = {"run": "ready", "skip": "ready", "cancel": "canceled", "pause": "paused"}
    assert workflow.state == expected_state[action]
    closed = executions(geneva_session, workflow, "capture")[0]
    assert closed.timed_out_at is not None
    if action != "run":
        assert closed.outcome == "timed_out"


def test_expire_wait_on_a_paused_workflow_only_passes_the_deadline(geneva_session, fired):
    workflow, parked = _parked(geneva_session, CancelFlow)
    workflow.pause()
    geneva_session.commit()
    expire_wait(workflow)
    assert fired == []
    workflow.resume()
    geneva_session.commit()
    assert fired == [(parked.id, "cancel")]


def test_expire_wait_refuses_what_cannot_time_out(geneva_session):
    workflow = create_workflow(geneva_session, CancelFlow)
    with pytest.raises(RuntimeError, match="no execution parked"):
        expire_wait(workflow)

    class NoTimeoutFlow(Workflow):
        @step(wait_for="go")
        def gated(self) -> None: ...

    try:
        other = create_workflow(geneva_session, NoTimeoutFlow)
        perform_next_step(other)
        with pytest.raises(RuntimeError, match="has no timeout="):
            expire_wait(other)
    finally:
        unregister("NoTimeoutFlow")


# --- reattempts of a timed-out body ---------------------------------------------------------

attempts: list[bool] = []


class ReattemptedTimeoutFlow(Workflow):
    @step(wait_for="go", timeout=60, on_timeout="run")
    def gated(self) -> None:
        attempts.append(self.wait_timed_out)
        if len(attempts) == 1:
            self.reattempt()


def test_a_reattempted_timed_out_body_runs_again_without_waiting(geneva_session):
    attempts.clear()
    workflow = create_workflow(geneva_session, ReattemptedTimeoutFlow)
    perform_next_step(workflow)
    expire_wait(workflow)
    speedrun_workflow(workflow)
    assert attempts == [True, True]
    assert [(s, o) for _, s, o in summary(geneva_session, workflow)] == [
        ("completed", "reattempted"),
        ("completed", "timed_out"),
    ]


# --- deploys ---------------------------------------------------------------------------------


def _deploy(timeout):
    """Define (or redefine, as a deploy would) the DeployedFlow class."""
    options = {"timeout": timeout, "on_timeout": "cancel"} if timeout is not None else {}

    class DeployedFlow(Workflow):
        @step(wait_for="payment_confirmed", **options)
        def capture(self) -> None: ...

    return DeployedFlow


@pytest.fixture
def deployed():
    yield _deploy
    unregister("DeployedFlow")


def test_a_deploy_adding_timeout_starts_the_clock_of_parked_executions_at_its_first_sweep(
    geneva_session, fired, deployed
):
    old = deployed(None)
    workflow = create_workflow(geneva_session, old)
    perform_next_step(workflow)
    parked = executions(geneva_session, workflow)[-1]
    assert parked.timeout_at is None
    # Parked long ago: a clock from waiting_since would fire at once.
    _set(geneva_session, parked, waiting_since=utcnow() - timedelta(days=30))

    deployed(THREE_DAYS)
    first_sweep = utcnow()
    dispatch_due(first_sweep)
    assert fired == []
    adopted = executions(geneva_session, workflow)[-1]
    assert adopted.state == "waiting"
    assert adopted.timeout_at == first_sweep + THREE_DAYS
    dispatch_due(first_sweep + THREE_DAYS - timedelta(seconds=1))
    assert fired == []
    dispatch_due(first_sweep + THREE_DAYS)
    assert fired == [(parked.id, "cancel")]


def test_a_deploy_removing_timeout_lets_parked_executions_wait_on(geneva_session, fired, deployed):
    deployed(THREE_DAYS)
    workflow = create_workflow(geneva_session, registered_workflows()["DeployedFlow"])
    perform_next_step(workflow)
    parked = executions(geneva_session, workflow)[-1]
    assert parked.timeout_at is not None
    deployed(None)
    dispatch_due(parked.timeout_at + timedelta(days=1))
    assert fired == []
    still = executions(geneva_session, workflow)[-1]
    assert (still.state, still.timeout_at) == ("waiting", None)
    # Re-bound the reloaded workflow to the class of the new code.
    geneva_session.expire_all()
    assert "times out" not in geneva_session.get(Workflow, workflow.id).why_waiting()


def _set(session, execution, **values):
    row = session.get(StepExecution, execution.id)
    for key, value in values.items():
        setattr(row, key, value)
    session.commit()


# --- the why-line ----------------------------------------------------------------------------


def test_the_why_line_says_when_the_wait_times_out_and_what_then(geneva_session):
    workflow, parked = _parked(geneva_session, CancelFlow)
    now = parked.waiting_since + timedelta(hours=2)
    assert workflow.why_waiting(now) == (
        "waiting for signal `payment_confirmed` since 2 h — times out in 2 d 22 h (then cancel)"
    )
    assert workflow.why_waiting(parked.timeout_at - timedelta(seconds=90)).endswith(
        "times out in 1 min 30 s (then cancel)"
    )
    assert workflow.why_waiting(parked.timeout_at + timedelta(seconds=3)).endswith(
        "times out now (then cancel)"
    )


def test_signals_table_is_untouched_by_time_outs(geneva_session):
    workflow, _ = _parked(geneva_session, CancelFlow)
    expire_wait(workflow)
    assert geneva_session.scalars(select(Signal)).all() == []


# --- the processes that sweep ------------------------------------------------------------------


def _loop_until_fired(fired: list[tuple[int, str]], *, interval: float) -> None:
    """Run the embedded worker's loop (``run_dispatcher(dispatch=False)``) every ``interval``
    seconds in a thread until a time-out has fired (at most 20 s), then stop it."""
    stop = threading.Event()
    loop = threading.Thread(
        target=run_dispatcher,
        args=(stop,),
        kwargs={"interval": interval, "housekeeping": False, "dispatch": False},
    )
    loop.start()
    try:
        for _ in range(800):
            if fired:
                break
            time.sleep(0.025)
    finally:
        stop.set()
        loop.join(10)


def test_the_embedded_loop_fires_time_outs_without_dispatching(geneva_session, fired):
    """``geneva-drive up`` and ``geneva-drive worker`` run run_dispatcher(dispatch=False)."""
    _, parked = _parked(geneva_session, CancelFlow)
    _move_deadline(geneva_session, parked, utcnow())
    _loop_until_fired(fired, interval=0.05)
    assert fired == [(parked.id, "cancel")]


def test_the_first_sweep_after_the_deadline_fires_it(geneva_session, fired, monkeypatch):
    """Within one dispatch interval: the loop sweeps every interval, no sweep before
    the deadline fires, and the first sweep that starts at or after it does."""
    _, parked = _parked(geneva_session, CancelFlow)
    # A whole second, so that every database stores it exactly (MariaDB keeps no fraction
    # unless asked), half a second to a second and a half ahead.
    deadline = (utcnow() + timedelta(seconds=1.5)).replace(microsecond=0)
    _move_deadline(geneva_session, parked, deadline)
    sweeps: list[tuple[datetime, int]] = []
    sweep = dispatch.fire_timeouts

    def recorded() -> int:  # the loop's call: fire_timeouts() with the time of the sweep
        moment = utcnow()
        sweeps.append((moment, sweep(moment)))
        return sweeps[-1][1]

    monkeypatch.setattr(dispatch, "fire_timeouts", recorded)
    _loop_until_fired(fired, interval=0.1)
    assert fired == [(parked.id, "cancel")]
    early = [count for moment, count in sweeps if moment < deadline]
    late = [count for moment, count in sweeps if moment >= deadline]
    assert early and set(early) == {0}  # it swept before the deadline and fired nothing
    assert late[0] == 1  # the first sweep at or after the deadline fired it


def test_the_dispatcher_loop_sweeps_every_dispatch_interval(monkeypatch):
    """The other half of "within one dispatch interval": the loop's period is the setting
    (beat runs this same loop in its own process)."""
    monkeypatch.setattr(settings, "dispatch_interval", timedelta(seconds=7))
    waits: list[float] = []

    class OneSweep(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            self.set()
            return True

    monkeypatch.setattr(dispatch, "fire_timeouts", lambda: 0)
    # The loop waits out the rest of the period after its sweep; the sweep's own time is held
    # at 0.25 s (a loaded machine's real one varied by seconds), so the wait is exactly what
    # the period leaves.
    ticks = iter([100.0, 100.25])
    monkeypatch.setattr(dispatch, "time", SimpleNamespace(monotonic=lambda: next(ticks, 100.25)))
    run_dispatcher(OneSweep(), housekeeping=False, dispatch=False)
    assert waits == [pytest.approx(6.75)]


def test_the_celery_beat_task_fires_time_outs(geneva_session, fired):
    _, parked = _parked(geneva_session, SkipFlow)
    _move_deadline(geneva_session, parked, utcnow())
    dispatch_due_task()
    assert fired == [(parked.id, "skip")]
