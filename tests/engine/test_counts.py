"""The per-state counts keep ``ready`` and ``performing`` under one row and split it on read
(the counts table, within a step's statement budget): a step costs no count statement, and
the counts still say how many workflows are being performed right now."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from geneva_drive import Workflow, counts, step
from geneva_drive.executor import execute
from geneva_drive.workflow import Workflow as WorkflowModel
from tests.engine.helpers import make_order, other_session

seen_during_step: list[dict[tuple[str, str], int]] = []


class CountedFlow(Workflow):
    @step
    def first(self) -> None:
        # Another connection, as the overview's: the claim (performing) has committed.
        with other_session() as reader:
            seen_during_step.append(counts.read(reader))

    @step
    def second(self) -> None:
        pass


def exact(session: Any) -> dict[tuple[str, str], int]:
    rows = session.execute(
        select(WorkflowModel.type, WorkflowModel.state, func.count()).group_by(
            WorkflowModel.type, WorkflowModel.state
        )
    ).all()
    return {(t, s): int(n) for t, s, n in rows}


def test_a_workflow_being_performed_is_counted_as_performing(geneva_session):
    seen_during_step.clear()
    running = CountedFlow.create(hero=make_order(geneva_session))
    CountedFlow.create(hero=make_order(geneva_session))  # stays ready
    geneva_session.commit()

    execute(running.current_execution.id)

    assert seen_during_step == [{(running.type, "performing"): 1, (running.type, "ready"): 1}]
    geneva_session.expire_all()
    assert counts.read(geneva_session) == exact(geneva_session) == {(running.type, "ready"): 2}


def test_the_table_keeps_ready_and_performing_as_ongoing(geneva_session):
    from geneva_drive.models import Base

    table = Base.metadata.tables["geneva_drive_workflow_counts"]
    CountedFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    stored = geneva_session.execute(
        select(table.c.state, func.sum(table.c.count)).group_by(table.c.state)
    ).all()
    assert {s: int(n) for s, n in stored} == {counts.ONGOING: 1}
    assert counts.bucket("performing") == counts.bucket("ready") == counts.ONGOING
    assert counts.bucket("paused") == "paused"
