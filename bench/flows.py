"""Workflows the bench runs in worker processes (``GENEVA_WORKFLOW_MODULES=bench.flows``).

Every step body appends ``<class> <workflow id> <step index> <start> <end> <pid>`` (wall-clock
seconds) to ``GENEVA_BENCH_TIMINGS/<pid>.log`` with one ``os.write`` on an O_APPEND file, so
several processes never interleave.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from geneva_drive import Workflow, step

_fd: int | None = None


def record(workflow: Workflow, index: int, started: float) -> None:
    global _fd
    directory = os.environ.get("GENEVA_BENCH_TIMINGS")
    if not directory:
        return
    if _fd is None:
        _fd = os.open(
            os.path.join(directory, f"{os.getpid()}.log"),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
            0o644,
        )
    line = f"{type(workflow).__name__} {workflow.id} {index} {started!r} {time.time()!r} {os.getpid()}\n"
    os.write(_fd, line.encode())


class HopFlow(Workflow):
    """Three no-op steps (B2/B3 and the embedded default)."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, 0, time.time())

    @step
    def two(self) -> None:
        record(self, 1, time.time())

    @step
    def three(self) -> None:
        record(self, 2, time.time())


class ChainFlow(Workflow):
    """Ten no-op steps (B3's throughput, and the long chains of the fresh-start scenario)."""

    may_proceed_without_hero = True


for _index in range(10):

    def _body(self: Workflow, index: int = _index) -> None:
        record(self, index, time.time())

    ChainFlow.add_step(f"c{_index}", _body)


class FreshFlow(Workflow):
    """One no-op step: the newly created workflow whose start delay is measured."""

    may_proceed_without_hero = True

    @step
    def only(self) -> None:
        record(self, 0, time.time())


class SignalFlow(Workflow):
    """B5: a no-op step, then a step parked until the ``go`` signal arrives."""

    may_proceed_without_hero = True

    @step
    def prepare(self) -> None:
        record(self, 0, time.time())

    @step(wait_for="go")
    def woken(self) -> None:
        record(self, 1, time.time())


class DelayedFlow(Workflow):
    """B6: one step a week ahead (the bench moves ``scheduled_for`` to spread them out)."""

    may_proceed_without_hero = True

    @step(wait=timedelta(days=7))
    def later(self) -> None:
        record(self, 0, time.time())


class WaitUntilFlow(Workflow):
    """B6: one plain step held by a per-workflow ``wait_until`` job option (1 min to 7 days
    ahead): held to the dispatch horizon like ``scheduled_for``, never a long countdown."""

    may_proceed_without_hero = True

    @step
    def held(self) -> None:
        record(self, 0, time.time())


if os.environ.get("GENEVA_BENCH_TRACE") == "1":  # bench/hop_trace.py: where a hop goes
    from bench import hop_trace

    hop_trace.install()
