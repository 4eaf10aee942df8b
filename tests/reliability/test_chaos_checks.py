"""The chaos run's wait checker on a race made to happen, with the real dispatcher.

The race the chaos run can only hit by luck: the dispatcher's sweep reads a parked execution
past its deadline, a signal for it commits, then the sweep takes the workflow's lock. The
engine rechecks under the lock that the execution is still parked, so the signal wins and the
time-out does nothing. Here the signal is delivered exactly in that gap (the sweep's lock
statement is built after its read; the hook delivers first), and the checker the chaos run
uses (``invariants.check_waits``) must find every wait went one way. Without the recheck the
sweep fires on the woken execution, and the checker says so: "timed out ... but holds signal".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from geneva_drive import Workflow, dispatch, step
from geneva_drive.models import StepExecution, utcnow
from tests.reliability.harness import drain, new_workflow, requires_postgres, session_scope
from tests.reliability.invariants import assert_invariants, check_waits

pytestmark = requires_postgres


class ChaosCheckDeadline(Workflow):
    @step(wait_for="reply", timeout=timedelta(minutes=5), on_timeout="skip")
    def reply(self) -> None:
        assert self.received_signal is not None

    @step
    def close(self) -> None:
        pass


def test_a_signal_in_the_sweeps_gap_wins_and_the_checker_agrees(rdb: Any, monkeypatch: Any) -> None:
    ids = [new_workflow(ChaosCheckDeadline) for _ in range(4)]
    drain()  # each parks at `reply`
    with session_scope() as session:
        parked = session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id.in_(ids), StepExecution.state == "waiting")
            .values(timeout_at=utcnow() - timedelta(seconds=1))
        )
        assert parked.rowcount == len(ids)

    pending = list(ids)
    reached: list[bool] = []
    real = dispatch.dialect_for

    class SignalInTheGap:
        """The sweep's dialect, delivering the signals between its read and its lock."""

        def __init__(self, dialect: Any) -> None:
            self.dialect = dialect

        def __getattr__(self, name: str) -> Any:
            return getattr(self.dialect, name)

        def lock(self, query: Any, **options: Any) -> Any:
            # The time-out batch locks workflows (the send claim locks executions: ``of=``).
            while pending and "of" not in options:
                reached.append(True)
                workflow_id = pending.pop()
                with session_scope() as session:
                    workflow = session.get(Workflow, workflow_id)
                    assert workflow is not None
                    workflow.signal("reply", {"n": workflow_id})
            return self.dialect.lock(query, **options)

    monkeypatch.setattr(dispatch, "dialect_for", lambda session: SignalInTheGap(real(session)))
    dispatch.fire_timeouts()
    monkeypatch.setattr(dispatch, "dialect_for", real)
    assert reached and not pending, "the sweep never reached its lock: nothing was due"

    violations, figures = check_waits(rdb)
    assert violations == [], "\n".join(violations)
    assert figures["timed_out"] == 0
    drain()
    violations, figures = check_waits(rdb)
    assert violations == [], "\n".join(violations)
    assert figures["woken_by_signal"] == len(ids)
    with session_scope() as session:
        states = set(session.scalars(select(Workflow.state).where(Workflow.id.in_(ids))))
    assert states == {"finished"}
    assert_invariants(rdb, quiescent=True)
