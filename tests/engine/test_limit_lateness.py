"""Waiting nobody chose is late (docs/MANUAL.md, "Concurrency and rate limits"): an execution
a limit has held back for longer than the overdue grace is late, named by its limit and key,
and never "overdue" (its ``scheduled_for`` is its next recheck, not a time it missed); a rate
deferral whose token is due says so, never "next start in 0 ms"; a step running far past its
own recent durations is flagged, whatever the flat stuck threshold says."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update

from geneva_drive import ConcurrencyLimit, RateLimit, Workflow, executor, lateness, step
from geneva_drive.models import StepExecution, utcnow
from tests.engine.helpers import executions, make_order


class FloodSync(Workflow):
    concurrency_limit = ConcurrencyLimit("flood-sync", limit=1, key=lambda wf: wf.hero.status)

    @step
    def pull(self) -> None:
        pass


class FloodCall(Workflow):
    @step(rate_limit=RateLimit("flood-api", limit=1, per=timedelta(hours=1)))
    def call(self) -> None:
        pass


def _create(session: Any, cls: type[Workflow], status: str = "megacorp") -> Any:
    workflow = cls.create(hero=make_order(session, status))
    session.commit()
    return workflow


def _hold_slot(session: Any, workflow: Any, started_ago: timedelta = timedelta(0)) -> None:
    """A worker is running the workflow's step (its slot is taken)."""
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(state="in_progress", started_at=utcnow() - started_ago)
    )
    session.execute(update(Workflow).where(Workflow.id == workflow.id).values(state="performing"))
    session.commit()


def _held_late(session: Any) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(StepExecution)
            .where(lateness.held_late_condition(utcnow()))
        )
    )


def test_a_deferral_past_the_grace_is_late_names_the_limit_and_is_never_overdue(
    geneva_session: Any,
) -> None:
    holder = _create(geneva_session, FloodSync)
    waiter = _create(geneva_session, FloodSync)
    _hold_slot(geneva_session, holder)
    executor.execute(executions(geneva_session, waiter)[0].id)
    [execution] = executions(geneva_session, waiter)
    assert execution.deferred_on == "flood-sync/megacorp"
    assert execution.deferred_since is not None
    now = utcnow()
    assert not lateness.is_held_late(execution, now)
    assert waiter.why_waiting() == "waiting for a slot of `flood-sync` [megacorp] (1 of 1 in use)"

    # 17 minutes later, still no slot (its recheck keeps moving scheduled_for ahead).
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(
            deferred_since=now - timedelta(minutes=17), scheduled_for=now + timedelta(seconds=20)
        )
    )
    geneva_session.commit()
    geneva_session.refresh(execution)
    assert lateness.is_held_late(execution, utcnow())
    assert not lateness.is_overdue(execution, utcnow())
    assert _held_late(geneva_session) == 1
    assert waiter.why_waiting() == (
        "waiting for a slot of `flood-sync` [megacorp] (1 of 1 in use) since 17 min (late)"
    )
    # Its recheck passed without a worker taking it: still held back, not "overdue".
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(scheduled_for=utcnow() - timedelta(minutes=5))
    )
    geneva_session.commit()
    geneva_session.refresh(execution)
    assert not lateness.is_overdue(execution, utcnow())
    overdue = select(func.count()).select_from(StepExecution)
    assert geneva_session.scalar(overdue.where(lateness.overdue_condition(utcnow()))) == 0


def test_a_rate_deferral_whose_token_is_due_says_so_not_next_start_in_0_ms(
    geneva_session: Any,
) -> None:
    first = _create(geneva_session, FloodCall)
    second = _create(geneva_session, FloodCall)
    executor.execute(executions(geneva_session, first)[0].id)
    executor.execute(executions(geneva_session, second)[0].id)
    [execution] = executions(geneva_session, second)
    assert execution.deferred_on == "flood-api/"
    assert second.why_waiting().startswith("waiting for a token of `flood-api`: next start in ")
    now = utcnow()
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(
            scheduled_for=now - timedelta(minutes=1), deferred_since=now - timedelta(minutes=61)
        )
    )
    geneva_session.commit()
    geneva_session.refresh(execution)
    line = second.why_waiting()
    assert line == "waiting for a token of `flood-api` since 1 h (late): its token is due now"
    assert "0 ms" not in line
    assert not lateness.is_overdue(execution, utcnow())


def test_a_step_running_far_past_its_own_history_is_flagged(geneva_session: Any) -> None:
    now = utcnow()
    for _ in range(lateness.HISTORY_MIN_SAMPLES):
        done = _create(geneva_session, FloodSync, "history")
        executor.execute(executions(geneva_session, done)[0].id)
    usual = lateness.usual_durations(geneva_session, {("FloodSync", "pull")}, utcnow())
    assert usual[("FloodSync", "pull")] < timedelta(seconds=5)
    assert lateness.running_long_after(usual[("FloodSync", "pull")]) == lateness.RUNNING_LONG_FLOOR

    slow = _create(geneva_session, FloodSync, "slow")
    _hold_slot(geneva_session, slow, started_ago=timedelta(minutes=17))
    line = slow.why_waiting()
    assert line.startswith("running `pull` for 17 min, far past its usual ")
    assert line.endswith(" (p99)")
    # Within the floor: not flagged, however fast the step usually is.
    fresh = _create(geneva_session, FloodSync, "fresh")
    _hold_slot(geneva_session, fresh, started_ago=timedelta(seconds=30))
    assert fresh.why_waiting() == "running `pull` for 30 s"
    # No history for a step: never flagged from it.
    assert lateness.usual_durations(geneva_session, {("FloodSync", "push")}, now) == {}
