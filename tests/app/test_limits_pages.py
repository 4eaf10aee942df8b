"""What operators see of concurrency limits (docs/MANUAL.md, "Concurrency and rate limits"):
/limits with in use, waiting and the
keys with most waiting, each linking to the workflows list filtered by limit and key, and the
why-line of a deferred execution."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from geneva_drive import ConcurrencyLimit, RateLimit, Workflow, executor, step
from geneva_drive.models import StepExecution
from tests.engine.helpers import executions, make_order


class DashTenantSync(Workflow):
    concurrency_limit = ConcurrencyLimit("dash-tenant", limit=1, key=lambda wf: wf.hero.status)

    @step
    def sync(self) -> None:
        pass


def _create(session: Any, status: str) -> Any:
    workflow = DashTenantSync.create(hero=make_order(session, status))
    session.commit()
    return workflow


def _running(session: Any, workflow: Any) -> None:
    """A worker is running its step (the slot of its key is taken)."""
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(state="in_progress")
    )
    session.execute(update(Workflow).where(Workflow.id == workflow.id).values(state="performing"))
    session.commit()


def test_limits_page_lists_use_and_waiting_keys_linked_to_the_filtered_list(
    operator_client: Any, geneva_session: Any
) -> None:
    holder = _create(geneva_session, "acme")
    waiter = _create(geneva_session, "acme")
    other = _create(geneva_session, "globex")
    _running(geneva_session, holder)
    executor.execute(executions(geneva_session, waiter)[0].id)
    assert executions(geneva_session, waiter)[0].deferred_on == "dash-tenant/acme"

    html = operator_client.get("/limits").get_data(as_text=True)
    assert "<code>dash-tenant</code>" in html
    assert "concurrency: 1 at once per key" in html
    # acme's waiter was tried and deferred; globex's has not been tried yet (due).
    assert "1 in use</a> · 2 waiting (1 due, 1 deferred)" in html
    assert 'href="/workflows?limit=dash-tenant&amp;limit_key=acme"' in html
    assert ">Limits</a>" in html  # in the main navigation

    listed = operator_client.get("/workflows?limit=dash-tenant&limit_key=acme").get_data(
        as_text=True
    )
    assert f"/workflows/{waiter.id}" in listed and f"/workflows/{holder.id}" in listed
    assert f"/workflows/{other.id}" not in listed
    assert "waiting for a slot of" in listed and "(1 of 1 in use)" in listed
    every_key = operator_client.get("/workflows?limit=dash-tenant").get_data(as_text=True)
    assert f"/workflows/{other.id}" in every_key
    detail = operator_client.get(f"/workflows/{waiter.id}").get_data(as_text=True)
    assert "waiting for a slot of" in detail


def test_limits_page_without_limits_says_so(operator_client: Any) -> None:
    html = operator_client.get("/limits").get_data(as_text=True)
    assert "<h1>Limits</h1>" in html


class DashCarrier(Workflow):
    @step(rate_limit=RateLimit("dash-carrier", limit=2, per=60))
    def book(self) -> None:
        pass


def test_definitions_show_a_steps_limits(operator_client: Any) -> None:
    html = operator_client.get("/definitions/DashCarrier").get_data(as_text=True)
    assert "rate_limit dash-carrier 2 per 1 min" in html
