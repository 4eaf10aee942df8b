"""An operator in Chromium follows a demo order to its child workflows and back:
the parent's page shows the children's progress and links to the filtered list, a child's page
links to its parent, and a bulk pause over the children list pauses the child chosen."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.examples.fulfilment import FulfilmentWorkflow
from geneva_drive.models import StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login

pytestmark = pytest.mark.browser


def _waiting_order() -> int:
    with db.new_session() as session:
        found = session.scalar(
            select(Workflow.id)
            .join(StepExecution, StepExecution.workflow_id == Workflow.id)
            .where(
                Workflow.type == FulfilmentWorkflow.workflow_name,
                StepExecution.step_name == "invoice",
                StepExecution.state == "waiting",
            )
            .order_by(Workflow.id)
            .limit(1)
        )
    assert found is not None
    return int(found)


def _children(parent_id: int) -> dict[int, str]:
    with db.new_session() as session:
        rows = session.execute(
            select(Workflow.id, Workflow.state)
            .where(Workflow.parent_id == parent_id)
            .order_by(Workflow.id)
        )
        return {int(i): str(s) for i, s in rows}


def test_operator_follows_a_parent_to_its_children_and_back(live_server, page):
    from playwright.sync_api import expect

    parent_id = _waiting_order()
    kids = _children(parent_id)
    assert sorted(kids.values()) == ["finished", "finished", "finished", "paused", "ready"]
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows/{parent_id}")
    expect(page.locator("#why-line")).to_contain_text("waiting for 2 child workflows to end")
    progress = page.locator("#wf-children a")
    expect(progress).to_have_text("3 of 5 finished, 1 paused, 1 running")

    progress.click()
    expect(page).to_have_url(re.compile(rf"/workflows\?parent={parent_id}$"))
    for child_id in kids:
        expect(page.locator(f"#wf-{child_id}")).to_have_count(1)
    expect(page.locator("#results tbody tr")).to_have_count(len(kids))

    running = next(i for i, s in kids.items() if s == "ready")
    page.locator(f"#wf-{running} a[href='/workflows/{running}']").first.click()
    expect(page).to_have_url(f"{base}/workflows/{running}")
    parent_link = page.locator("#wf-parent a")
    expect(parent_link).to_have_text(f"#{parent_id}")

    # Bulk over the parent's children: pause the one still running.
    page.goto(f"{base}/workflows?parent={parent_id}")
    page.locator(f"input[name=ids][value='{running}']").check()
    page.get_by_role("button", name="Pause selected").click()
    expect(page.locator("#bulk-count")).to_have_text("1 workflow will be paused.")
    page.locator("#bulk-dialog").get_by_role("button", name=re.compile(r"^Pause")).click()
    expect(page.locator("#bulk-done")).to_contain_text("1 done")
    assert _children(parent_id)[running] == "paused"
    page.get_by_role("button", name="Close").click()

    page.goto(f"{base}/workflows/{running}")
    page.locator("#wf-parent a").click()
    expect(page).to_have_url(f"{base}/workflows/{parent_id}")
    expect(page.locator("#wf-children a")).to_have_text("3 of 5 finished, 2 paused")
