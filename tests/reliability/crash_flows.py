"""Workflows the crash tests run in real worker processes (imported by the workers through
``GENEVA_WORKFLOW_MODULES``) and the fault hooks they arm from environment variables.

Every step body appends ``<workflow id> <step> <event> <execution id> <pid>`` to the file named
by ``GENEVA_TEST_LOG`` (O_APPEND, one write per line), so "how many times did this body run,
and in which execution row" is known independently of the database.

Fault hooks (armed only in processes whose environment sets them; each fires once per
workflow, remembered by a marker file next to the log, so a restarted worker runs normally):

* ``GENEVA_CRASH_HANG_BODY=1`` — ``CrashBodyWorkflow.body`` hangs mid-body.
* ``GENEVA_CRASH_HANG_FINALIZE=1`` — finalize of ``CrashFinalizeWorkflow.work`` hangs after the
  result is applied, before the commit (holding the workflow lock).
* ``GENEVA_CRASH_HANG_CHILD_FINALIZE=1`` — finalize of the first ``CrashChildWorkflow.work`` to
  get there hangs after its end was reported to the parent (holding the parent's row lock),
  before the commit: a worker killed during the join.
* ``GENEVA_CRASH_HANG_SEND=1`` — the first commit that queued step messages hangs after the
  commit and before the messages are sent.
* ``GENEVA_CRASH_HANG_INLINE=1`` — a worker about to run a successor itself (inline successors)
  hangs after the predecessor's commit, before it claims the successor.
* ``GENEVA_CRASH_HANG_LIMIT=1`` — ``CrashLimitWorkflow.body`` hangs mid-body, holding the one
  slot of its concurrency limit.

The test SIGKILLs the worker once the ``hang`` line shows up.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from geneva_drive import (
    ConcurrencyLimit,
    ExceptionPolicy,
    IterableStep,
    Workflow,
    resumable_step,
    step,
)
from geneva_drive.instrumentation import inline_successor, step_finalized
from geneva_drive.models import StepExecution
from tests.reliability.ledger import write_ledger_row

HANG_SECONDS = 120


def _log_path() -> str | None:
    return os.environ.get("GENEVA_TEST_LOG")


def _write(line: str) -> None:
    path = _log_path()
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def record(workflow: Workflow, step_name: str, event_name: str = "ran") -> None:
    # The running execution, read on a connection of its own: the step's session must not
    # keep a connection (and a transaction) open through the body because of our bookkeeping.
    from sqlalchemy import select as _select

    from geneva_drive import db
    from geneva_drive.models import StepExecution

    with db.get_engine().connect() as connection:
        execution_id = connection.scalar(
            _select(StepExecution.id).where(
                StepExecution.workflow_id == workflow.id, StepExecution.state == "in_progress"
            )
        )
    _write(f"{workflow.id} {step_name} {event_name} {execution_id or 0} {os.getpid()}\n")


def _first_time(name: str) -> bool:
    """True once per marker name (across processes)."""
    path = _log_path()
    if not path:
        return False
    marker = Path(f"{path}.{name}")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _hang(workflow_id: Any, what: str) -> None:
    _write(f"{workflow_id} {what} hang 0 {os.getpid()}\n")
    time.sleep(HANG_SECONDS)


class Ledger:
    """The body-run records of one log file."""

    def __init__(self, path: Path) -> None:
        self.lines: list[tuple[int, str, str, int]] = []
        if path.exists():
            for line in path.read_text().splitlines():
                wf, step_name, event_name, execution_id, _pid = line.split(" ")
                self.lines.append((int(wf), step_name, event_name, int(execution_id)))

    def events(self, workflow_id: int) -> list[tuple[str, str]]:
        return [(s, e) for wf, s, e, _x in self.lines if wf == workflow_id]

    def count(self, workflow_id: int, step_name: str, event_name: str = "ran") -> int:
        return sum(
            1 for wf, s, e, _x in self.lines if (wf, s, e) == (workflow_id, step_name, event_name)
        )

    def runs_per_execution(self, event_name: str) -> Counter[int]:
        """How many times each execution row ran a body (counting ``event_name`` lines)."""
        return Counter(x for _wf, _s, e, x in self.lines if e == event_name and x)


class CrashBodyWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def body(self) -> None:
        record(self, "body", "start")
        if os.environ.get("GENEVA_CRASH_HANG_BODY") and _first_time(f"body-{self.id}"):
            _hang(self.id, "body")
        record(self, "body", "end")

    @step
    def after(self) -> None:
        record(self, "after", "start")


class CrashLimitWorkflow(Workflow):
    """One step, at most one in progress at once in one pool (a concurrency limit)."""

    may_proceed_without_hero = True
    concurrency_limit = ConcurrencyLimit("crash-slot", limit=1)

    @step
    def body(self) -> None:
        record(self, "body", "start")
        if os.environ.get("GENEVA_CRASH_HANG_LIMIT") and _first_time(f"limit-{self.id}"):
            _hang(self.id, "limit")
        record(self, "body", "end")


class CrashFinalizeWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        record(self, "work", "start")

    @step
    def after(self) -> None:
        record(self, "after", "start")


@step_finalized.connect
def _hang_in_finalize(sender: Any, **payload: Any) -> None:
    if not os.environ.get("GENEVA_CRASH_HANG_FINALIZE"):
        return
    if (
        payload.get("workflow_class") != "CrashFinalizeWorkflow"
        or payload.get("step_name") != "work"
    ):
        return
    if _first_time(f"finalize-{payload['workflow_id']}"):
        _hang(payload["workflow_id"], "finalize")


class CrashChildWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        record(self, "work", "start")


class CrashParentWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def fan_out(self) -> None:
        for _ in range(2):
            self.start_child(CrashChildWorkflow, allow_multiple=True)

    @step(wait_for_children=True)
    def join(self) -> None:
        record(self, "join", "start")


@step_finalized.connect
def _hang_in_child_finalize(sender: Any, **payload: Any) -> None:
    if not os.environ.get("GENEVA_CRASH_HANG_CHILD_FINALIZE"):
        return
    if payload.get("workflow_class") != "CrashChildWorkflow":
        return
    if _first_time("child-finalize"):
        _hang(payload["workflow_id"], "finalize")


class CrashSendWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, "one", "start")

    @step
    def two(self) -> None:
        record(self, "two", "start")


@event.listens_for(Session, "after_commit", insert=True)
def _hang_between_commit_and_send(session: Session) -> None:
    # insert=True: runs before geneva_drive.transport's own after_commit hook, which sends.
    if not os.environ.get("GENEVA_CRASH_HANG_SEND"):
        return
    pending = session.info.get("geneva_pending_messages")
    if pending and _first_time("send"):
        ids = ",".join(str(message.execution_id) for _chain, message in pending)
        _hang(0, f"send:{ids}")


class CrashInlineWorkflow(Workflow):
    """Two plain steps: a worker with inline successors runs ``two`` itself after ``one``."""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, "one", "start")

    @step
    def two(self) -> None:
        record(self, "two", "start")

    @step
    def three(self) -> None:
        record(self, "three", "start")


@inline_successor.connect
def _record_inline_hand_off(sender: Any, **payload: Any) -> None:
    # "<workflow> inline handoff <successor execution> <pid>": the soak counts these.
    _write(f"{payload['workflow_id']} inline handoff {payload['execution_id']} {os.getpid()}\n")


@inline_successor.connect
def _hang_before_inline_successor(sender: Any, **payload: Any) -> None:
    # After one's outcome (and two's unsent row) committed, before two is claimed.
    if not os.environ.get("GENEVA_CRASH_HANG_INLINE"):
        return
    if _first_time(f"inline-{payload['workflow_id']}"):
        _hang(payload["workflow_id"], f"inline:{payload['execution_id']}")


class CrashSuccessorRaisesWorkflow(Workflow):
    """``two`` raises right after ``one``: whose task does the error belong to?"""

    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        record(self, "one", "start")

    @step
    def two(self) -> None:
        record(self, "two", "start")
        raise RuntimeError("the successor's own failure")


class CrashManyWorkflow(Workflow):
    """Three steps with short waits: many of them keep messages in flight at any moment."""

    may_proceed_without_hero = True

    @step
    def a(self) -> None:
        record(self, "a", "start")

    @step(wait=timedelta(seconds=0.5))
    def b(self) -> None:
        record(self, "b", "start")

    @step(wait=timedelta(seconds=1))
    def c(self) -> None:
        record(self, "c", "start")


class CrashDbDropWorkflow(Workflow):
    """A resumable walk over 12 slowish items, checkpointing after each; its database
    connection is terminated under it."""

    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: IterableStep) -> None:
        def work(item: int) -> None:
            record(self, "walk", f"item-{item}")
            time.sleep(0.25)

        it.iterate_over(range(12), work)

    @step
    def after(self) -> None:
        record(self, "after", "start")


class CrashNapWorkflow(Workflow):
    """A plain step that naps while its worker's database connections are terminated."""

    may_proceed_without_hero = True

    @step
    def nap(self) -> None:
        record(self, "nap", "start")
        time.sleep(1.5)
        record(self, "nap", "end")

    @step
    def after(self) -> None:
        record(self, "after", "start")


class CrashNapDbWorkflow(Workflow):
    """Like CrashNapWorkflow, but the body queries through the step's session after the nap,
    on the connection that was terminated meanwhile. A policy reattempts database errors."""

    may_proceed_without_hero = True
    exception_policies = (
        ExceptionPolicy(
            "reattempt",
            matching="sqlalchemy.exc.OperationalError",
            wait=timedelta(seconds=0.2),
            max_reattempts=3,
            report="never",
        ),
    )

    @step
    def nap(self) -> None:
        from sqlalchemy import text as _text

        record(self, "nap", "start")
        self.session.execute(_text("SELECT 1"))  # the session now holds a connection
        time.sleep(1.5)
        self.session.execute(_text("SELECT 1"))
        record(self, "nap", "end")

    @step
    def after(self) -> None:
        record(self, "after", "start")


# --- the soak -----------------------------------------------------------------------------------


class SoakFault(Exception):
    """The injected step failure (reattempted by policy, up to a point)."""


def _roll(execution_id: int, salt: str) -> float:
    import random

    return random.Random(f"{execution_id}:{salt}").random()


#: The soak's steps that write a row of the ledger of committed writes (tests/reliability/
#: ledger.py) through self.session in every attempt that can succeed.
SOAK_WRITING_STEPS = ("prepare", "nap", "gate", "finish", "c1", "c2", "c3", "c4", "c5")


class SoakWorkflow(Workflow):
    """prepare → nap (0.3 s wait, sometimes a random reattempt wait) → gate (waits for "go")
    → finish. prepare and nap fail 15% of the time; the policy reattempts up to 5 times and
    then pauses the workflow (an operator resumes it).

    Every step writes its ledger row through ``self.session`` before it may fail: the row must
    commit exactly when the execution ends ``completed``/``success``."""

    may_proceed_without_hero = True

    def before_step_execution(self, execution: StepExecution) -> None:
        self._running_execution_id = execution.id

    def _ledger(self, step_name: str) -> None:
        write_ledger_row(self, step_name, self._running_execution_id)

    exception_policies = (
        ExceptionPolicy(
            "reattempt",
            matching=SoakFault,
            wait=timedelta(seconds=0.2),
            max_reattempts=5,
            terminal_action="pause",
            report="never",
        ),
    )

    def _maybe_fail(self, step_name: str) -> None:
        execution = self.current_execution
        if execution is not None and _roll(execution.id, step_name) < 0.15:
            record(self, step_name, "fail")
            raise SoakFault(f"injected failure in {step_name}")

    @step
    def prepare(self) -> None:
        record(self, "prepare", "start")
        self._ledger("prepare")
        self._maybe_fail("prepare")

    @step(wait=timedelta(seconds=0.3))
    def nap(self) -> None:
        record(self, "nap", "start")
        execution = self.current_execution
        if self.id % 4 == 0 and execution is not None and _roll(execution.id, "wait") < 0.5:
            record(self, "nap", "rewait")
            self.reattempt(wait=0.1 + _roll(execution.id, "len") * 0.5)
        self._ledger("nap")
        self._maybe_fail("nap")

    @step(wait_for="go")
    def gate(self) -> None:
        record(self, "gate", "start")
        self._ledger("gate")

    @step
    def finish(self) -> None:
        record(self, "finish", "start")
        self._ledger("finish")


class SoakChainWorkflow(Workflow):
    """Five plain steps due at once: a worker runs them as one inline chain (budget allowing),
    each failing 15% of the time like SoakWorkflow's; workers are killed mid-chain too."""

    may_proceed_without_hero = True
    exception_policies = SoakWorkflow.exception_policies
    _maybe_fail = SoakWorkflow._maybe_fail
    before_step_execution = SoakWorkflow.before_step_execution
    _ledger = SoakWorkflow._ledger

    @step
    def c1(self) -> None:
        record(self, "c1", "start")
        self._ledger("c1")
        self._maybe_fail("c1")

    @step
    def c2(self) -> None:
        record(self, "c2", "start")
        self._ledger("c2")
        self._maybe_fail("c2")

    @step
    def c3(self) -> None:
        record(self, "c3", "start")
        self._ledger("c3")
        self._maybe_fail("c3")

    @step
    def c4(self) -> None:
        record(self, "c4", "start")
        self._ledger("c4")
        self._maybe_fail("c4")

    @step
    def c5(self) -> None:
        record(self, "c5", "start")
        self._ledger("c5")
