"""Seeded rows for the metrics tests, inserted directly (the queries only read them).

Three classes, with every number the gauges report known in advance (relative to ``now``):

MetricsAlpha: ready 3, paused 1, performing 1, finished 2 (total 7, paused_ratio 1/7)
    scheduled executions: 10 min overdue, 2 min overdue, due in 1 h (not overdue), and one
    2 h overdue that belongs to the paused workflow (not counted: paused keeps its execution);
    one in_progress execution started 2 h ago (stuck; threshold 1 h);
    completed executions of the finished workflows (counted nowhere).
MetricsBeta: ready 2, performing 1, canceled 1 (total 4, paused_ratio 0)
    two waiting executions, parked 8 days (overdue; threshold 7 days) and 1 hour;
    one in_progress execution started 5 min ago (not stuck).
MetricsGamma: paused 1 (paused_ratio 1.0) with a scheduled execution 3 h overdue (not counted).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from geneva_drive import counts
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow

EXPECTED_STATES = {
    "MetricsAlpha": {"ready": 3, "performing": 1, "paused": 1, "finished": 2, "canceled": 0},
    "MetricsBeta": {"ready": 2, "performing": 1, "paused": 0, "finished": 0, "canceled": 1},
    "MetricsGamma": {"ready": 0, "performing": 0, "paused": 1, "finished": 0, "canceled": 0},
}
EXPECTED = {
    # workflow: (paused_ratio, waiting, waiting_overdue, overdue, stuck_in_progress)
    "MetricsAlpha": (1 / 7, 0, 0, 2, 1),
    "MetricsBeta": (0.0, 2, 1, 0, 0),
    "MetricsGamma": (1.0, 0, 0, 0, 0),
}
OLDEST_OVERDUE = timedelta(minutes=10)


def seed(session: Session, now: datetime) -> None:
    def workflow(type_: str, state: str) -> int:
        return int(
            session.execute(
                insert(Workflow.__table__)
                .values(type=type_, state=state, allow_multiple=True, created_at=now,
                        updated_at=now)
                .returning(Workflow.__table__.c.id)
            ).scalar_one()
        )  # fmt: skip

    def execution(workflow_id: int, state: str, scheduled_for: datetime, **extra: Any) -> None:
        session.execute(
            insert(StepExecution.__table__).values(
                workflow_id=workflow_id,
                step_name="one",
                state=state,
                scheduled_for=scheduled_for,
                created_at=now,
                updated_at=now,
                **extra,
            )
        )

    minute, hour, day = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
    execution(workflow("MetricsAlpha", "ready"), "scheduled", now - 10 * minute)
    execution(workflow("MetricsAlpha", "ready"), "scheduled", now - timedelta(minutes=2))
    execution(workflow("MetricsAlpha", "ready"), "scheduled", now + hour)
    execution(workflow("MetricsAlpha", "paused"), "scheduled", now - 2 * hour)
    execution(
        workflow("MetricsAlpha", "performing"),
        "in_progress",
        now - 3 * hour,
        started_at=now - 2 * hour,
    )
    for _ in range(2):
        finished = workflow("MetricsAlpha", "finished")
        execution(finished, "completed", now - 3 * day, started_at=now - 3 * day,
                  completed_at=now - 3 * day, outcome="success")  # fmt: skip

    execution(workflow("MetricsBeta", "ready"), "waiting", now - 9 * day,
              waiting_since=now - 8 * day)  # fmt: skip
    execution(workflow("MetricsBeta", "ready"), "waiting", now - 2 * hour,
              waiting_since=now - hour)  # fmt: skip
    execution(workflow("MetricsBeta", "performing"), "in_progress", now - 10 * minute,
              started_at=now - 5 * minute)  # fmt: skip
    workflow("MetricsBeta", "canceled")

    execution(workflow("MetricsGamma", "paused"), "scheduled", now - 3 * hour)
    # Rows inserted by Core bypass the engine's per-state counts: recount them, as the manual
    # says to after writing workflows outside the engine.
    counts.rebuild(session)
    session.commit()
