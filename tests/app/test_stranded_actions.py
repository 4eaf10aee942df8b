"""A workflow stranded on a step its class no longer defines: the detail page offers no action
that cannot do what its confirmation says (Reattempt, Resume), a stale form's POST is refused
with the engine's message and the way out, and nothing is scheduled (docs/MANUAL.md,
"Recovering a stranded workflow with resume_at")."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import select, update

from geneva_drive.errors import StepNotDefinedError
from geneva_drive.models import OperatorAction, StepExecution
from geneva_drive.testing import perform_next_step
from geneva_drive.workflow import Workflow
from tests.app.conftest import post


def _stranded(make_workflow, geneva_session) -> int:
    """Paused on ``send_sms`` (never defined by DashPayment) with the workflow's pointer still
    on ``authorize``: a resume would run ``authorize``."""
    wf = make_workflow()
    geneva_session.execute(
        update(StepExecution).where(StepExecution.workflow_id == wf.id).values(step_name="send_sms")
    )
    geneva_session.commit()
    geneva_session.expire_all()
    with contextlib.suppress(StepNotDefinedError):
        perform_next_step(wf)
    geneva_session.commit()
    assert (wf.state, wf.next_step_name) == ("paused", "authorize")
    return int(wf.id)


def _executions(session, workflow_id: int) -> list[tuple[str, str]]:
    session.expire_all()
    return [
        (e.step_name, e.state)
        for e in session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow_id)
            .order_by(StepExecution.id)
        )
    ]


def test_the_detail_offers_resume_at_not_reattempt(operator_client, make_workflow, geneva_session):
    workflow_id = _stranded(make_workflow, geneva_session)
    html = operator_client.get(f"/workflows/{workflow_id}").get_data(as_text=True)
    actions = html.split('aria-label="Actions"', 1)[1].split("</div>\n</div>", 1)[0]
    assert ">Reattempt</button>" not in actions
    assert ">Resume</button>" not in actions
    assert ">Resume at</button>" in actions
    assert "stranded on <code>send_sms</code>" in html


@pytest.mark.parametrize("action", ["reattempt", "resume"])
def test_a_stale_reattempt_is_refused_with_the_way_out(
    operator_client, make_workflow, geneva_session, action
):
    workflow_id = _stranded(make_workflow, geneva_session)
    before = _executions(geneva_session, workflow_id)
    response = post(operator_client, f"/workflows/{workflow_id}/{action}", htmx=True)
    assert response.status_code == 409
    refusal = response.get_data(as_text=True).split('class="refusal"', 1)[1].split("</p>", 1)[0]
    assert f"Cannot {action} DashPayment #{workflow_id}: step &#39;send_sms&#39; is no" in refusal
    assert "resume_at(step_name)" in refusal
    assert _executions(geneva_session, workflow_id) == before
    workflow = geneva_session.get(Workflow, workflow_id)
    assert workflow is not None and workflow.state == "paused"
    [row] = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.workflow_id == workflow_id)
    ).all()
    assert (row.action, row.result) == (action, "refused")
    assert "Step scheduled to run again" not in (row.message or "")


def test_bulk_reattempt_preview_counts_the_stranded_as_not_done(
    operator_client, make_workflow, geneva_session
):
    workflow_id = _stranded(make_workflow, geneva_session)
    html = operator_client.get(f"/workflows/bulk?action=reattempt&ids={workflow_id}").get_data(
        as_text=True
    )
    assert "stranded on a step DashPayment no longer defines (use resume-at or cancel)" in html
