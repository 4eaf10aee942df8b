"""A workflow with thousands of executions shows its newest page of them; "Older
executions" loads the page before (HTMX, keyset on the oldest execution shown), until the
first. The step plan still says what the newest execution of each step says.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from sqlalchemy import insert

from geneva_drive.dashboard.queries import TIMELINE_PAGE
from geneva_drive.models import StepExecution, utcnow
from tests.app.conftest import DashPayment
from tests.app.plans import full_scans, page_plans
from tests.engine.helpers import make_order

_EXEC = re.compile(r'id="exec-(\d+)"')
_OLDER = re.compile(r'hx-get="([^"]*/timeline\?before=(\d+))"')


def _long_history(session: Any, executions: int) -> tuple[DashPayment, list[int]]:
    """A ready workflow with ``executions`` completed runs of authorize, one a second, then
    its current execution (charge, scheduled)."""
    workflow = DashPayment.create(hero=make_order(session), session=session)
    session.commit()
    start = utcnow() - timedelta(days=2)
    rows = [
        {
            "workflow_id": workflow.id,
            "step_name": "authorize",
            "state": "completed",
            "outcome": "success",
            "scheduled_for": start + timedelta(seconds=i),
            "started_at": start + timedelta(seconds=i),
            "completed_at": start + timedelta(seconds=i),
            "finished_at": start + timedelta(seconds=i),
            # Two executions share each created_at: the keyset must order them by id too.
            "created_at": start + timedelta(seconds=i // 2),
            "updated_at": start + timedelta(seconds=i),
        }
        for i in range(executions)
    ]
    session.execute(insert(StepExecution), rows)
    session.commit()
    ids = [
        e.id
        for e in session.query(StepExecution)
        .filter(StepExecution.workflow_id == workflow.id)
        .order_by(StepExecution.created_at, StepExecution.id)
    ]
    return workflow, ids


def test_the_detail_page_shows_the_newest_executions_and_pages_back_to_the_first(
    operator_client, geneva_session
):
    workflow, ids = _long_history(geneva_session, 2 * TIMELINE_PAGE + 30)
    assert len(ids) == 2 * TIMELINE_PAGE + 31  # and the current one, created by create()

    page = operator_client.get(f"/workflows/{workflow.id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    shown = [int(i) for i in _EXEC.findall(html)]
    # The newest page: the current execution (created now by create()) and the backdated
    # history's newest runs, oldest first.
    assert shown == ids[-TIMELINE_PAGE:]
    assert "Older executions" in html

    seen = list(shown)
    for _ in range(5):
        found = _OLDER.search(html)
        if found is None:
            break
        url, before = found.groups()
        assert int(before) == seen[0]
        older = operator_client.get(url.replace("&amp;", "&"), headers={"HX-Request": "true"})
        assert older.status_code == 200
        html = older.get_data(as_text=True)
        assert "<html" not in html  # the list items only, swapped in place of the link
        batch = [int(i) for i in _EXEC.findall(html)]
        assert batch and len(batch) <= TIMELINE_PAGE
        seen = batch + seen
    assert seen == ids  # every execution once, in order, and no link past the first
    assert "Older executions" not in html

    # Without JavaScript the link opens the detail page at that page.
    plain = operator_client.get(f"/workflows/{workflow.id}/timeline?before={ids[-1]}")
    assert plain.status_code == 302
    at = operator_client.get(plain.headers["Location"]).get_data(as_text=True)
    assert [int(i) for i in _EXEC.findall(at)] == ids[-1 - TIMELINE_PAGE : -1]
    assert "Newest executions" in at
    # The live region polls that page, not the newest one (a refresh keeps what is read).
    assert f'hx-get="/workflows/{workflow.id}?before={ids[-1]}"' in at


def test_the_plan_reads_the_newest_run_of_each_step_not_the_page(operator_client, geneva_session):
    """authorize ran long before the page shown: the plan still says done for it."""
    workflow, _ids = _long_history(geneva_session, TIMELINE_PAGE + 5)
    html = operator_client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    plan = html.split('id="plan-title"', 1)[1].split("</section>", 1)[0]
    row = plan.split("<code>authorize</code>", 1)[1].split("</tr>", 1)[0]
    assert "done" in row, row


def test_the_timeline_page_reads_one_range_of_the_workflow_created_index(app, geneva_session):
    workflow, ids = _long_history(geneva_session, 30)
    plans = page_plans(app, f"/workflows/{workflow.id}/timeline?before={ids[-1]}")
    page = [
        (s, p)
        for s, p in plans
        if "FROM geneva_drive_step_executions" in s and "ORDER BY" in s and "LIMIT" in s
    ]
    assert page, [s[:160] for s, _ in plans]
    for statement, plan in page:
        assert "index_geneva_drive_step_executions_on_workflow_created" in plan, (statement, plan)
        assert not full_scans(plan, ("geneva_drive_step_executions",)), plan
