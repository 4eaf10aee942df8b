"""CampaignWorkflow: the resumable ``deliver`` step works through the subscribers in a chain of
executions (at most 25 mails each), checkpoints its cursor, and sends each mail exactly once
however the chain is cut."""

from __future__ import annotations

from sqlalchemy import select

from geneva_drive.examples.campaign import CampaignWorkflow
from geneva_drive.examples.models import DemoCampaign, DemoSubscriber
from geneva_drive.testing import (
    assert_cursor,
    assert_step_executed,
    assert_step_has_successor,
    assert_workflow_state,
    perform_next_step,
    run_iterations,
    speedrun_current_step,
    speedrun_workflow,
)
from tests.engine.helpers import executions

SUBSCRIBERS = 60


def _start(session, subscribers=SUBSCRIBERS):
    campaign = DemoCampaign(name="Spring sale", delivered=0)
    session.add(campaign)
    session.flush()
    # Another campaign's subscribers must not be mailed.
    other = DemoCampaign(name="Other", delivered=0)
    session.add(other)
    session.flush()
    session.add_all(
        DemoSubscriber(campaign_id=campaign.id, email=f"s{n}@example.com")
        for n in range(subscribers)
    )
    session.add_all(
        DemoSubscriber(campaign_id=other.id, email=f"o{n}@example.com") for n in range(5)
    )
    session.flush()
    ids = list(
        session.scalars(
            select(DemoSubscriber.id)
            .where(DemoSubscriber.campaign_id == campaign.id)
            .order_by(DemoSubscriber.id)
        )
    )
    return CampaignWorkflow.create(hero=campaign, session=session), campaign, ids


def _deliver_links(session, workflow):
    return executions(session, workflow, "deliver")


def test_deliver_is_a_chain_of_executions_that_mails_everyone_once(geneva_session):
    wf, campaign, ids = _start(geneva_session)
    perform_next_step(wf)  # prepare
    # As a worker runs it: each execution stops after the step's 25 checkpoints.
    for _ in range(3):
        assert perform_next_step(wf).step_name == "deliver"
    links = _deliver_links(geneva_session, wf)
    # 25 + 25 + 10: each link stops at its checkpoint budget and continues in a successor.
    assert len(links) == 3
    assert [link.outcome for link in links] == ["continued", "continued", "success"]
    assert links[1].continues_from_id == links[0].id
    assert links[2].continues_from_id == links[1].id
    assert [link.cursor_value for link in links[:2]] == [ids[24], ids[49]]
    geneva_session.refresh(campaign)
    assert campaign.delivered == SUBSCRIBERS
    assert wf.current_execution.step_name == "report"  # not run into the next step

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    assert_step_executed(wf, "report")
    geneva_session.refresh(campaign)
    assert campaign.delivered == SUBSCRIBERS


def test_an_interrupted_chain_resumes_at_its_cursor_without_resending(geneva_session):
    # run_iterations cuts a link after N checkpoints; speedrun_current_step then follows the
    # chain to the step's end (in one execution: the helper does not interrupt).
    wf, campaign, ids = _start(geneva_session)
    perform_next_step(wf)  # prepare

    # Stop the first link after 10 mails (as a worker shutting down would, at a checkpoint).
    first = run_iterations(wf, 10)
    assert first.outcome == "continued"
    assert_step_has_successor(wf, "deliver")
    assert_cursor(wf, ids[9])
    geneva_session.refresh(campaign)
    assert campaign.delivered == 10

    second = run_iterations(wf, 7)
    assert second.continues_from_id == first.id
    assert_cursor(wf, ids[16])
    geneva_session.refresh(campaign)
    assert campaign.delivered == 17

    speedrun_current_step(wf)
    geneva_session.refresh(campaign)
    # Every subscriber exactly once: a resent mail would push the count past the subscribers.
    assert campaign.delivered == SUBSCRIBERS
    assert_step_executed(wf, "deliver")
    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")


def test_a_campaign_without_subscribers_finishes(geneva_session):
    wf, campaign, _ = _start(geneva_session, subscribers=0)
    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    assert len(_deliver_links(geneva_session, wf)) == 1
    geneva_session.refresh(campaign)
    assert campaign.delivered == 0
