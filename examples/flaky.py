"""Feed import, the one that fails: a flaky feed times out twice and is reattempted (after a
few seconds) until it works; a broken feed has a malformed row, the parse raises, and the
workflow pauses with the error for an operator to look at (then skip, reattempt or cancel)."""

from __future__ import annotations

from datetime import timedelta

from geneva_drive import ExceptionPolicy, Workflow, step
from geneva_drive.examples._work import work


class FeedTimeout(Exception):
    pass


class FeedImportWorkflow(Workflow):
    exception_policies = (
        ExceptionPolicy(
            "reattempt",
            matching=FeedTimeout,
            wait=timedelta(seconds=5),
            max_reattempts=3,
            # Timeouts are expected; only the one that exhausts the reattempts is reported.
            report="terminal_only",
        ),
    )

    @step
    def fetch(self) -> None:
        work()
        feed = self.hero
        # Written through the step's session, so it commits only with a fetch that succeeds:
        # a timed-out attempt's writes roll back with it (manual, "Transactions"). How often
        # the feed was tried is what the execution rows say, not a counter the attempt wrote.
        feed.fetch_attempts += 1
        timed_out = sum(1 for e in self.step_executions if e.step_name == "fetch" and e.outcome)
        if feed.kind == "flaky" and timed_out < 2:
            raise FeedTimeout(f"{feed.url} did not answer within 10 s")

    @step
    def parse(self) -> None:
        work()
        if self.hero.kind == "broken":
            raise ValueError(f"malformed row 17 in {self.hero.url}: expected 6 columns, got 5")

    @step
    def publish(self) -> None:
        work()
