"""An operator in Chromium opens /limits on the demo: the tenant-sync limit shows
its slots in use and the tenant with most waiting; following that key opens the workflows list
filtered by limit and key, whose rows are exactly the workflows under that slot in the
database, each saying why it waits."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.examples.seed import SYNC_TENANTS
from geneva_drive.examples.tenant_sync import TenantSyncWorkflow
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, screenshot

pytestmark = pytest.mark.browser


def _under_slot(slot: str) -> tuple[set[int], set[int]]:
    """(every workflow whose current execution holds or waits for ``slot``, the deferred ones)."""
    with db.new_session() as session:
        rows = session.execute(
            select(Workflow.id, StepExecution.deferred_on)
            .join(StepExecution, StepExecution.workflow_id == Workflow.id)
            .where(
                Workflow.type == TenantSyncWorkflow.workflow_name,
                StepExecution.limit_slot == slot,
                StepExecution.state.in_(["scheduled", "in_progress"]),
            )
        ).all()
    return {r[0] for r in rows}, {r[0] for r in rows if r[1] == slot}


def test_operator_follows_the_busiest_key_of_a_limit_to_its_workflows(live_server, page):
    from playwright.sync_api import expect

    busiest, _started, running = SYNC_TENANTS[0]
    under, deferred = _under_slot(f"tenant-sync/{busiest}")
    assert len(deferred) >= 1 and len(under) == len(deferred) + running

    base = live_server.url
    login(page, base, "olga")
    page.goto(base)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Limits").click()
    page.wait_for_url(f"{base}/limits")  # and its load (open_first)
    card = page.locator("#limit-tenant-sync")
    expect(card).to_contain_text("concurrency: 2 at once per key")
    # The flooding tenant (test_limit_flood.py) comes first; acme is listed with its line.
    first_key = card.locator("tbody tr").filter(has=page.get_by_role("link", name=busiest))
    expect(first_key.locator("td").nth(2)).to_have_text(str(len(deferred)))
    screenshot(page, "limits")

    first_key.get_by_role("link", name=busiest).click()
    # And its load: htmx must have run before "Pause selected" is clicked (open_first).
    page.wait_for_url(f"{base}/workflows?limit=tenant-sync&limit_key={busiest}")
    rows = page.locator("tr[id^='wf-']")
    expect(rows).to_have_count(len(under))
    shown = {int(i.removeprefix("wf-")) for i in rows.evaluate_all("rs => rs.map(r => r.id)")}
    assert shown == under
    for workflow_id in deferred:
        expect(page.locator(f"#wf-{workflow_id}")).to_contain_text(
            f"waiting for a slot of tenant-sync [{busiest}] (2 of 2 in use)"
        )
