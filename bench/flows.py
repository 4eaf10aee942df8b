"""Workflows the bench runs in worker processes (``GENEVA_WORKFLOW_MODULES=bench.flows``).

Every step body appends ``<class> <workflow id> <step index> <start> <end> <pid>`` (wall-clock
seconds) to ``GENEVA_BENCH_TIMINGS/<pid>.log`` with one ``os.write`` on an O_APPEND file, so
several processes never interleave.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from bench.common import apply_counts_off, apply_insert_unfolded, apply_waiting_uncached
from geneva_drive import ConcurrencyLimit, Workflow, step

# Paired rounds with a part of the engine stubbed or set back (the counts upsert, the
# remembered broker answer) reach the workers this way: they import this module
# (GENEVA_WORKFLOW_MODULES) and inherit the environment.
apply_counts_off()
apply_waiting_uncached()
apply_insert_unfolded()

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


def _b11_key(workflow: Workflow) -> int:
    """B11's tenants: the workflow id modulo GENEVA_B11_KEYS (the bench and its workers agree)."""
    return workflow.id % int(os.environ.get("GENEVA_B11_KEYS", "50"))


def _b11_body(workflow: Workflow) -> None:
    started = time.time()
    time.sleep(float(os.environ.get("GENEVA_B11_WORK_S", "0.02")))
    record(workflow, 1, started)


class LimitedFlow(Workflow):
    """B11: one step, at most 2 at once per key (a concurrency limit), ~20 ms of work."""

    may_proceed_without_hero = True
    concurrency_limit = ConcurrencyLimit("b11-tenant", limit=2, key=_b11_key)

    @step
    def work(self) -> None:
        _b11_body(self)


class UnlimitedFlow(Workflow):
    """B11's baseline: the same step without a limit."""

    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        _b11_body(self)


def _b12_committed(workflow: Workflow, started: float) -> None:
    """B12: when the parent's fan-out step commits, record (started, commit time) as index 2.

    An instance listener on the step's session, fired by the real commit (not a savepoint's).
    """
    from sqlalchemy import event

    from geneva_drive.scheduling import session_of

    session = session_of(workflow)
    workflow_id = workflow.id
    done: list[bool] = []

    def committed(_session: object) -> None:
        # after_commit fires for a released savepoint too; only the real commit counts.
        if not done and session.get_nested_transaction() is None:
            done.append(True)
            line = f"FleetOrder {workflow_id} 2 {started!r} {time.time()!r} {os.getpid()}\n"
            directory = os.environ.get("GENEVA_BENCH_TIMINGS")
            if directory:
                with open(os.path.join(directory, f"{os.getpid()}.commit.log"), "a") as fh:
                    fh.write(line)

    event.listen(session, "after_commit", committed)


class FleetLine(Workflow):
    """B12's child: one no-op step."""

    may_proceed_without_hero = True

    @step
    def ship(self) -> None:
        record(self, 0, time.time())


class FleetOrder(Workflow):
    """B12's parent: one step starts GENEVA_B12_CHILDREN children, the next joins them."""

    may_proceed_without_hero = True

    @step
    def fan_out(self) -> None:
        started = time.time()
        for _ in range(int(os.environ.get("GENEVA_B12_CHILDREN", "1000"))):
            self.start_child(FleetLine, allow_multiple=True)
        record(self, 0, started)
        _b12_committed(self, started)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        record(self, 1, time.time())


if os.environ.get("GENEVA_BENCH_SQL_COUNT"):  # bench/sql_count.py: statements per step
    from bench import sql_count

    sql_count.install()
