"""The limit metrics on /metrics (docs/MANUAL.md, "Concurrency and rate limits"): in use and
waiting per limit name (from the
database), and the deferral counter (from the executor). Labels carry the name, never a key."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from geneva_drive import ConcurrencyLimit, Workflow, executor, step
from geneva_drive.models import StepExecution
from geneva_drive.prometheus import clear_limit_cache
from tests.engine.helpers import executions, make_order
from tests.metrics.test_exposition import app, samples, scrape

__all__ = ["app"]


class MetricTenantSync(Workflow):
    concurrency_limit = ConcurrencyLimit("metric-tenant", limit=1, key=lambda wf: wf.hero.status)

    @step
    def sync(self) -> None:
        pass


def test_in_use_waiting_and_deferrals_per_limit_name(app: Any, geneva_session: Any) -> None:
    holder = MetricTenantSync.create(hero=make_order(geneva_session, "acme"))
    waiter = MetricTenantSync.create(hero=make_order(geneva_session, "acme"))
    geneva_session.commit()
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == holder.id)
        .values(state="in_progress")
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == holder.id).values(state="performing")
    )
    geneva_session.commit()
    clear_limit_cache()
    executor.execute(executions(geneva_session, waiter)[0].id)
    clear_limit_cache()
    families = scrape(app.test_client())
    label = (("limit", "metric-tenant"),)
    assert samples(families["geneva_drive_limit_in_use"])[label] == 1
    assert samples(families["geneva_drive_limit_waiting"])[label] == 1
    deferrals = samples(families["geneva_drive_limit_deferrals"])
    assert deferrals[label] >= 1  # the counter is per process: other tests may add to it


def test_limit_gauges_follow_the_metrics_cache_period(app: Any, count_statements: Any) -> None:
    """METRICS_CACHE_SECONDS governs every database gauge: at 0 each scrape reads the limits
    again; with a period, a second scrape within it reads nothing for them."""
    from geneva_drive import metrics
    from geneva_drive.dashboard.extensions import db

    def limit_reads(counter: Any) -> int:
        return sum("deferred_on" in statement for statement in counter.selects())

    previous = metrics.cache_max_age()
    with app.app_context():
        engine = db.engine
    try:
        for period, reads in ((0.0, 2), (60.0, 1)):
            metrics.configure_cache(max_age=period)
            clear_limit_cache()
            with count_statements(engine) as counter:
                scrape(app.test_client())
                scrape(app.test_client())
            assert limit_reads(counter) == reads, f"cache period {period} s"
    finally:
        metrics.configure_cache(max_age=previous)
        clear_limit_cache()
