"""FeedImportWorkflow: a flaky feed's timeouts are reattempted until the fetch works; a broken
feed pauses the workflow with the parse error, and an operator can resume it once fixed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from geneva_drive.examples.flaky import FeedImportWorkflow, FeedTimeout
from geneva_drive.examples.models import DemoFeed
from geneva_drive.instrumentation import set_error_reporter
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import (
    assert_step_executed,
    assert_workflow_state,
    perform_next_step,
    speedrun_workflow,
)
from tests.engine.helpers import executions


@pytest.fixture
def reported():
    errors = []
    set_error_reporter(lambda error, context: errors.append(error))
    yield errors
    set_error_reporter(None)


def _start(session, kind):
    feed = DemoFeed(url=f"https://feeds.example/{kind}.csv", kind=kind)
    session.add(feed)
    session.flush()
    return FeedImportWorkflow.create(hero=feed, session=session), feed


def _fetches(session, workflow):
    return executions(session, workflow, "fetch")


def test_a_flaky_feed_is_reattempted_until_the_fetch_works(geneva_session, reported):
    wf, feed = _start(geneva_session, "flaky")
    for _ in range(2):
        # The step's error still reaches the caller; the policy has scheduled a reattempt.
        with pytest.raises(FeedTimeout):
            perform_next_step(wf)
        assert wf.state == "ready"
        retry = wf.current_execution
        assert retry.step_name == "fetch"
        assert retry.scheduled_for - utcnow() > timedelta(seconds=3)  # the policy's 5 s wait

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    fetches = _fetches(geneva_session, wf)
    assert [f.outcome for f in fetches] == ["reattempted", "reattempted", "success"]
    for reattempted in fetches[:2]:
        exception = reattempted.metadata_dict["exception"]
        assert exception["class"] == "geneva_drive.examples.flaky.FeedTimeout"
        assert "did not answer" in exception["message"]
    geneva_session.refresh(feed)
    # The timed-out attempts' writes rolled back with them: only the successful fetch counted.
    assert feed.fetch_attempts == 1
    assert_step_executed(wf, "publish")
    assert reported == []  # report="terminal_only": expected timeouts are not reported


def test_a_broken_feed_pauses_with_the_error_and_resumes(geneva_session, reported):
    wf, feed = _start(geneva_session, "broken")
    with pytest.raises(ValueError, match="malformed row 17"):
        speedrun_workflow(wf)
    assert_workflow_state(wf, "paused")
    assert_step_executed(wf, "fetch")
    assert_step_executed(wf, "parse", "failed")
    failed = geneva_session.scalars(
        select(StepExecution).where(
            StepExecution.workflow_id == wf.id, StepExecution.step_name == "parse"
        )
    ).one()
    assert failed.error_class_name == "ValueError"
    assert "malformed row 17" in failed.error_message
    assert len(reported) == 1

    # The operator fixes the feed and resumes: the parse runs again and the import finishes.
    feed.kind = "healthy"
    geneva_session.commit()
    wf.resume()
    geneva_session.commit()
    assert wf.state == "ready"
    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    assert_step_executed(wf, "parse")
    assert_step_executed(wf, "publish")
