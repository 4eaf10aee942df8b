"""Inline successors through a real Celery worker (prefork, a private Redis): a successor's
exception is the successor's, inline on and off.

Published, the successor's own task raises it (Celery logs ``perform_step[<its job id>]
raised``). Inline, the task that delivered the first step succeeded - it must not raise the
successor's error under its own task id; the error is recorded on the successor's row (with
its job id) and logged under the successor's execution.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import create_workflow, executions, wait_for_state, wait_until
from tests.reliability.crash_flows import CrashSuccessorRaisesWorkflow
from tests.reliability.test_crash import (  # noqa: F401 (fixtures)
    CeleryWorker,
    celery_worker,
    private_redis,
)

pytestmark = pytest.mark.integration

_RAISED = re.compile(r"perform_step\[([0-9a-f]{32})\] raised")
_SUCCEEDED = re.compile(r"perform_step\[([0-9a-f]{32})\] succeeded")
_ENDED = re.compile(r"perform_step\[([0-9a-f]{32})\] (?:raised|succeeded)")


@pytest.mark.parametrize("inline_on", [True, False], ids=["inline", "published"])
def test_a_successors_exception_is_attributed_to_the_successor_in_celery(
    celery_worker: CeleryWorker,  # noqa: F811 (the fixture imported above)
    shared_database,
    inline_on: bool,
) -> None:
    # A generous time budget: on a loaded machine the first step alone can outlast the default
    # 200 ms, and the successor would then be published, which is not the path under test.
    worker = celery_worker.start(
        GENEVA_INLINE_SUCCESSORS="true" if inline_on else "false",
        GENEVA_INLINE_SUCCESSOR_MAX_TIME="30",
    )
    workflow_id = create_workflow(CrashSuccessorRaisesWorkflow)
    wait_for_state(workflow_id, "paused", timeout=60)  # the default policy
    one, two = executions(workflow_id)
    assert (one.state, one.outcome) == ("completed", "success")
    assert (two.state, two.error_class_name) == ("failed", "RuntimeError")
    assert one.job_id and two.job_id and one.job_id != two.job_id
    # The rows commit before the task that ran the last step returns and Celery logs how it
    # ended; stopped before that, the pool process is terminated mid-task and the line is lost.
    last_task = one.job_id if inline_on else two.job_id
    wait_until(
        lambda: last_task in _ENDED.findall(Path(worker.log_path).read_text(errors="replace")),
        timeout=30,
        what=f"Celery to log the end of task {last_task}",
    )
    worker.stop()
    log = Path(worker.log_path).read_text(errors="replace")
    raised = set(_RAISED.findall(log))
    # The first step's task never carries the successor's failure.
    assert one.job_id not in raised, log
    assert one.job_id in set(_SUCCEEDED.findall(log)), log
    if inline_on:
        assert raised == set(), log
        assert f"inline successor execution {two.id} raised RuntimeError" in log, log
    else:
        assert raised == {two.job_id}, log
