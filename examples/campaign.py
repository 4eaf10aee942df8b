"""Campaign: deliver a mail to every subscriber with a resumable step. Each execution sends
at most 25 mails and checkpoints its cursor (the last subscriber id), so the work shows up as
a chain of executions, survives worker restarts and stops cleanly when paused."""

from __future__ import annotations

from sqlalchemy import select

from geneva_drive import IterableStep, Workflow, resumable_step, step
from geneva_drive.examples._work import work
from geneva_drive.examples.models import DemoSubscriber


class CampaignWorkflow(Workflow):
    @step
    def prepare(self) -> None:
        work()

    @resumable_step(max_iterations=25)
    def deliver(self, it: IterableStep) -> None:
        campaign = self.hero

        def send(subscriber: DemoSubscriber) -> None:
            campaign.delivered += 1

        it.iterate_over_records(
            select(DemoSubscriber).where(DemoSubscriber.campaign_id == campaign.id), send
        )

    @step
    def report(self) -> None:
        work()
