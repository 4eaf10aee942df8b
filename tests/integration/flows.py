"""Workflows the integration tests run in real worker processes.

Imported by the workers through ``GENEVA_WORKFLOW_MODULES=tests.integration.flows`` and by
the tests themselves. Every step body appends a line to the file named by
``GENEVA_TEST_LOG`` (O_APPEND, one write per line, so lines from several processes never
interleave): ``<workflow id> <step> <event> <pid>``. The file is the ground truth for "how
many times did this body run", independent of the database the engine writes.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from geneva_drive import ConcurrencyLimit, IterableStep, Workflow, resumable_step, step


def record(workflow: Workflow, step_name: str, event: str = "ran") -> None:
    path = os.environ.get("GENEVA_TEST_LOG")
    if not path:
        return
    line = f"{workflow.id} {step_name} {event} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def recorded(path: Path, workflow_id: int) -> list[tuple[str, str]]:
    """``[(step, event), …]`` recorded for one workflow, in order."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        wf, step_name, event, _pid = line.split(" ")
        if int(wf) == workflow_id:
            found.append((step_name, event))
    return found


class ItWaitsWorkflow(Workflow):
    """Three steps, the second after a one-second wait (sent at commit with a countdown)."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, "one")

    @step(wait=timedelta(seconds=1))
    def two(self) -> None:
        record(self, "two")

    @step
    def three(self) -> None:
        record(self, "three")


class ItDelayedWorkflow(Workflow):
    """``later`` waits 3 s: beyond the tests' 1 s dispatch horizon, so only the dispatcher
    sends it, once it is due."""

    may_proceed_without_hero = True

    @step
    def start(self) -> None:
        record(self, "start")

    @step(wait=timedelta(seconds=3))
    def later(self) -> None:
        record(self, "later")


class ItOnceWorkflow(Workflow):
    """One slowish step, so duplicated messages arrive while it runs and after it finished."""

    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        record(self, "only")
        time.sleep(0.5)


class ItSlowWorkflow(Workflow):
    """The first run of ``slow`` hangs (the test kills its worker meanwhile); reruns are quick.

    The marker file next to the log says the first run happened.
    """

    may_proceed_without_hero = True

    @step
    def slow(self) -> None:
        record(self, "slow", "start")
        marker = Path(os.environ["GENEVA_TEST_LOG"] + f".slow-{self.id}")
        if not marker.exists():
            marker.touch()
            time.sleep(120)
        record(self, "slow", "end")

    @step
    def after(self) -> None:
        record(self, "after")


class ItHopsWorkflow(Workflow):
    """Twenty empty steps: the step-to-step hop latency is all that is measured."""

    may_proceed_without_hero = True


for _n in range(20):
    ItHopsWorkflow.add_step(f"hop_{_n:02d}", lambda self: None)


class ItLongResumableWorkflow(Workflow):
    """A resumable step over 30 slowish items; each item is recorded before its checkpoint,
    so a warm shutdown leaves exactly the checkpointed items recorded."""

    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: IterableStep) -> None:
        def work(item: int) -> None:
            record(self, "walk", f"item-{item}")
            time.sleep(0.15)

        it.iterate_over(range(30), work)

    @step
    def after(self) -> None:
        record(self, "after")


class ItSignalWorkflow(Workflow):
    """Parks at ``wait_here`` until a ``go`` signal; records the payload it was woken with."""

    may_proceed_without_hero = True

    @step(wait_for="go")
    def wait_here(self) -> None:
        record(self, "wait_here", f"got-{self.received_signal.payload['n']}")

    @step
    def after(self) -> None:
        record(self, "after")


class ItInlineWorkflow(Workflow):
    """Three immediately-due steps: the worker that finishes one runs the next itself."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, "one")

    @step
    def two(self) -> None:
        record(self, "two")

    @step
    def three(self) -> None:
        record(self, "three")


class ItElsewhereWorkflow(Workflow):
    """The second step is routed to a queue no worker of the test consumes."""

    may_proceed_without_hero = True

    @step
    def here(self) -> None:
        record(self, "here")

    @step(job_options={"queue": "gd-it-nobody-consumes-this"})
    def elsewhere(self) -> None:
        record(self, "elsewhere")


def _parity(workflow: Workflow) -> str:
    return "even" if workflow.id % 2 == 0 else "odd"


class ItLimitedWorkflow(Workflow):
    """Two steps under one concurrency limit of 2 per key (the workflow id's parity): each
    body records its start and end with the key, so the log shows how many overlapped."""

    may_proceed_without_hero = True
    concurrency_limit = ConcurrencyLimit("it-tenant", limit=2, key=_parity)

    @step
    def one(self) -> None:
        record(self, "one", f"start-{_parity(self)}")
        time.sleep(0.2)
        record(self, "one", f"end-{_parity(self)}")

    @step
    def two(self) -> None:
        record(self, "two", f"start-{_parity(self)}")
        time.sleep(0.2)
        record(self, "two", f"end-{_parity(self)}")
