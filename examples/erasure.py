"""User erasure (GDPR-style): send the member their data export with a notice, wait out a
30-day grace period, anonymize their posts, then delete the member. A member who withdraws
the request during the grace period cancels the workflow (``cancel_if``). Deleting the hero
is the *last* step on purpose: a step after it would find no hero and cancel the workflow
(unless ``may_proceed_without_hero`` were set)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from geneva_drive import Workflow, step
from geneva_drive.examples._work import work
from geneva_drive.examples.models import DemoPost

GRACE_PERIOD = timedelta(days=30)
ANONYMOUS = "deleted member"
ERASED_BODY = "[erased at the author's request]"


class UserErasureWorkflow(Workflow):
    cancel_if = "request_withdrawn"

    @step
    def send_export(self) -> None:
        work()
        # A real application would mail the export and the erasure notice here.
        self.hero.export_sent = True

    @step(wait=GRACE_PERIOD)
    def anonymize_posts(self) -> None:
        work()
        self.session.execute(
            update(DemoPost)
            .where(DemoPost.member_id == self.hero.id)
            .values(member_id=None, author_name=ANONYMOUS, body=ERASED_BODY)
            .execution_options(synchronize_session=False)
        )

    @step
    def erase_member(self) -> None:
        work()
        self.session.delete(self.hero)

    def request_withdrawn(self) -> bool:
        return bool(self.hero.erasure_withdrawn)
