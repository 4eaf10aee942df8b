"""Worker liveness on /metrics: ``geneva_drive_workers{state}`` and
``geneva_drive_expired_worker_steps`` from the database, and
``geneva_drive_worker_recoveries_total{workflow}`` counted when the sweep really recovers an
expired worker's step (docs/MANUAL.md, "When a worker dies")."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from geneva_drive import Workflow, liveness, metrics, step
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import expire_worker
from tests.engine.helpers import executions, make_order
from tests.metrics.test_exposition import app, samples, scrape

__all__ = ["app"]


class MetricLivenessFlow(Workflow):
    @step
    def work(self) -> None:
        pass


def _figures(app: Any) -> tuple[dict[Any, float], float, float]:
    """(workers by state, executions held by workers not live, recoveries of this class)."""
    metrics.clear_cache()  # each scrape reads the database again
    families = scrape(app.test_client())
    workers = {dict(k)["state"]: v for k, v in samples(families["geneva_drive_workers"]).items()}
    [held] = samples(families["geneva_drive_expired_worker_steps"]).values()
    recoveries = samples(families["geneva_drive_worker_recoveries"]).get(
        (("workflow", "MetricLivenessFlow"),), 0.0
    )
    return workers, held, recoveries


def test_expired_workers_and_their_recovered_steps(app: Any, geneva_session: Any) -> None:
    liveness.register("celery", ["default"], name="celery@metrics/1")
    dying = liveness.register("celery", ["default"], name="celery@metrics/2")
    stopped = liveness.register("embedded", name="embedded@metrics/3")
    stopped.start()
    stopped.stop()
    workflow = MetricLivenessFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    [execution] = executions(geneva_session, workflow)
    # A step the dying worker started (what the executor writes at start, by hand here).
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(state="in_progress", started_at=utcnow(), worker_id=dying.worker_id)
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == workflow.id).values(state="performing")
    )
    geneva_session.commit()

    workers, held, before = _figures(app)
    assert workers == {"live": 2, "expired": 0}  # a stopped worker is not counted
    assert held == 0

    expire_worker(dying.worker_id)
    workers, held, _ = _figures(app)
    assert workers == {"live": 1, "expired": 1}
    assert held == 1  # what the next sweep recovers

    assert liveness.recover_expired() == 1
    workers, held, after = _figures(app)
    assert workers == {"live": 1, "expired": 1}  # the row stays a day, for the Workers page
    assert held == 0
    assert after == before + 1
    recovered = executions(geneva_session, workflow)
    assert recovered[0].outcome == "recovered"
