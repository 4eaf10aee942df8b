"""Deploy safety on the dashboard: the Definitions page's renamed-step drain count, and a workflow
parked on a step a deploy deleted shows on Stranded and in the overview once housekeeping
paused it."""

from __future__ import annotations

from geneva_drive import Workflow, housekeeping, renamed_step, step
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import make_order


class DeployPagesFlow(Workflow):
    old_capture = renamed_step(to="capture")

    @step(wait_for="payment_confirmed")
    def capture(self) -> None:
        pass


def test_definitions_show_the_renamed_line_and_when_it_can_go(operator_client, geneva_session):
    html = operator_client.get("/definitions/DeployPagesFlow").get_data(as_text=True)
    row = html.split('class="gravestone">old_capture', 1)[1].split("</tr>", 1)[0]
    assert "<code>capture</code>" in row
    assert "safe to delete the line" in row

    wf = DeployPagesFlow.create(hero=make_order(geneva_session))
    geneva_session.flush()
    wf.current_execution.step_name = "old_capture"  # scheduled by the code before the rename
    geneva_session.commit()
    html = operator_client.get("/definitions/DeployPagesFlow").get_data(as_text=True)
    row = html.split('class="gravestone">old_capture', 1)[1].split("</tr>", 1)[0]
    assert ">1<" in row and "safe to delete" not in row


def test_a_workflow_parked_on_a_deleted_step_shows_on_stranded_and_the_overview(
    operator_client, geneva_session
):
    class ParkedThenDeleted(Workflow):
        @step(wait_for="go")
        def wait_here(self) -> None:
            pass

    wf = ParkedThenDeleted.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()

    class ParkedThenDeleted(Workflow):  # type: ignore[no-redef]  # the deploy renamed it
        @step(wait_for="go")
        def waits_here(self) -> None:
            pass

    # Before housekeeping's pass: the inbox and the detail page say why, never "None".
    inbox = operator_client.get("/signals").get_data(as_text=True)
    assert "(stranded: `wait_here` no longer waits here)" in inbox
    assert "unknown signal" not in inbox
    detail = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "stranded: parked on <code>wait_here</code>, which is no longer defined" in detail
    assert "None" not in detail.split('id="why-line"', 1)[1].split("</p>", 1)[0]

    housekeeping.run()
    html = operator_client.get("/stranded").get_data(as_text=True)
    assert "ParkedThenDeleted" in html and "wait_here" in html
    overview = operator_client.get("/").get_data(as_text=True)
    assert "No stranded workflows" not in html
    card = overview.split('id="stat-stranded"', 1)[1].split("</a>", 1)[0]
    assert '<span class="n">1</span> stranded' in card


def test_the_overview_card_counts_unexplained_workflows_and_links_to_the_list(
    operator_client, geneva_session
):
    from datetime import timedelta

    from sqlalchemy import update

    from geneva_drive.models import StepExecution, utcnow

    overview = operator_client.get("/").get_data(as_text=True)
    card = overview.split('id="stat-unexplained"', 1)[1].split("</a>", 1)[0]
    assert '<span class="n">0</span> unexplained' in card
    assert "No unexplained workflows" in operator_client.get("/unexplained").get_data(as_text=True)

    wf = DeployPagesFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    long_ago = utcnow() - timedelta(hours=1)
    # Ready, but its execution is gone: nothing would ever run it.
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == wf.id)
        .values(state="canceled", outcome="canceled", finished_at=long_ago)
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == wf.id).values(transitioned_at=long_ago)
    )
    geneva_session.commit()
    overview = operator_client.get("/").get_data(as_text=True)
    card = overview.split('id="stat-unexplained"', 1)[1].split("</a>", 1)[0]
    assert '<span class="n">1</span> unexplained' in card and 'href="/unexplained"' in overview
    listing = operator_client.get("/unexplained").get_data(as_text=True)
    assert f'href="/workflows/{wf.id}"' in listing
    assert "ready_without_execution" in listing
    assert f"session.get(Workflow, {wf.id}).reattempt()" in listing


class _AnyVipSignal:
    """A ``wait_for=`` matcher object of the user's own, with no ``.name``."""

    def matches(self, signal: object) -> bool:
        return bool(getattr(signal, "name", "").startswith("vip_"))

    def __str__(self) -> str:
        return "any vip_ signal"


class NamelessMatcherFlow(Workflow):
    @step(wait_for=_AnyVipSignal())
    def wait_vip(self) -> None:
        pass


def test_a_healthy_waiter_on_a_matcher_without_a_name_is_not_called_stranded(
    operator_client, geneva_session
):
    wf = NamelessMatcherFlow.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()
    assert wf.current_execution.state == "waiting"
    inbox = operator_client.get("/signals").get_data(as_text=True)
    assert "any vip_ signal" in inbox
    assert "(stranded:" not in inbox
