"""Onboarding: a welcome mail, a nudge after a short wait (skipped when the profile is done),
tips two days later and a feedback request a week later. ``send_fax`` was removed and left
as a gravestone, so executions already scheduled for it drain (they are skipped)."""

from __future__ import annotations

import logging
from datetime import timedelta

from geneva_drive import Workflow, removed_step, step
from geneva_drive.examples._work import work

log = logging.getLogger(__name__)


class OnboardingWorkflow(Workflow):
    @step
    def send_welcome(self) -> None:
        work()
        log.debug("welcome mail to %s", self.hero.email)

    @step(wait=timedelta(seconds=20), skip_if="profile_complete")
    def nudge_profile(self) -> None:
        work()

    send_fax = removed_step()

    @step(wait=timedelta(days=2))
    def send_tips(self) -> None:
        work()

    @step(wait=timedelta(days=7))
    def ask_feedback(self) -> None:
        work()

    def profile_complete(self) -> bool:
        return bool(self.hero.profile_complete)
