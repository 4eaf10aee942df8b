"""Workflows of the Celery-fleet chaos run (``tests/reliability/chaos.py``), imported by its
workers through ``GENEVA_WORKFLOW_MODULES``, and the LEDGER they write.

Every step body writes one row into ``chaos_ledger`` through ``self.session`` - the step's own
transaction - and then dawdles a little, so that a fault (a cut connection, a killed worker)
or an operator action (pause, cancel, skip, resume_at) lands between the write and the
outcome. The manual's promise is that these rows commit if and only if the attempt's outcome
commits as success (or, for a resumable step, with the checkpoint that covers them); the
chaos run counts them against the executions afterwards (:func:`ledger_violations`).

The table lives in its own metadata (not the engine's ``Base``): it is the application's data,
created by the harness next to the engine's tables.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
)

from geneva_drive import (
    ConcurrencyLimit,
    ExceptionPolicy,
    IterableStep,
    RateLimit,
    Workflow,
    resumable_step,
    step,
)
from geneva_drive.models import StepExecution

ledger_metadata = MetaData()
#: One row per write a step body made through ``self.session``: which execution wrote it and,
#: for the resumable walk, which item.
LEDGER = Table(
    "chaos_ledger",
    ledger_metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("workflow_id", BigInteger, nullable=False, index=True),
    Column("step_name", String(64), nullable=False),
    Column("execution_id", BigInteger, nullable=False, index=True),
    Column("item", Integer, nullable=True),
    Column("pid", Integer, nullable=False),
)

#: Longest a body dawdles after its write (seconds): the window faults and operators hit.
DAWDLE = float(os.environ.get("GENEVA_CHAOS_DAWDLE", "0.4"))
#: How many items the resumable walk has.
WALK_ITEMS = 6


class ChaosFault(Exception):
    """The injected step failure: the body wrote its row, then failed (the row must go)."""


def _write(workflow: Workflow, step_name: str, item: int | None = None) -> int:
    execution = workflow.current_execution
    assert execution is not None, f"{step_name} of workflow {workflow.id} runs without execution"
    workflow.session.execute(
        insert(LEDGER).values(
            workflow_id=workflow.id,
            step_name=step_name,
            execution_id=execution.id,
            item=item,
            pid=os.getpid(),
        )
    )
    return int(execution.id)


def _dawdle() -> None:
    time.sleep(random.uniform(0.05, DAWDLE))


class ChaosLedgerFlow(Workflow):
    """a → b (0.3 s wait; fails 10 % after its write, reattempted) → gate (waits for "go") →
    c. Every body writes its ledger row first and then dawdles."""

    may_proceed_without_hero = True
    exception_policies = (
        ExceptionPolicy(
            "reattempt",
            matching=ChaosFault,
            wait=timedelta(seconds=0.2),
            max_reattempts=5,
            terminal_action="pause",
            report="never",
        ),
    )

    @step
    def a(self) -> None:
        _write(self, "a")
        _dawdle()

    @step(wait=timedelta(seconds=0.3))
    def b(self) -> None:
        execution_id = _write(self, "b")
        _dawdle()
        if random.Random(execution_id).random() < 0.1:
            raise ChaosFault(f"injected failure in b of workflow {self.id} after its write")

    @step(wait_for="go")
    def gate(self) -> None:
        _write(self, "gate")

    @step
    def c(self) -> None:
        _write(self, "c")
        _dawdle()


class ChaosWalkFlow(Workflow):
    """A resumable walk over WALK_ITEMS items, one ledger row per item, checkpointing after
    each (the cursor commits with the item's row); then ``done``."""

    may_proceed_without_hero = True

    @resumable_step
    def walk(self, it: IterableStep) -> None:
        def work(item: int) -> None:
            _write(self, "walk", item)
            time.sleep(random.uniform(0.02, DAWDLE / 2))

        it.iterate_over(range(WALK_ITEMS), work)

    @step
    def done(self) -> None:
        _write(self, "done")
        _dawdle()


#: Tenants of ChaosTenantFlow, each with TENANT_SLOTS concurrent executions at most and
#: PARTNER_CALLS starts of ``call_partner`` per PARTNER_WINDOW seconds.
TENANTS = 2
TENANT_SLOTS = 2
PARTNER_CALLS = 3
PARTNER_WINDOW = 1.0
#: How many children one ChaosFanOutFlow starts.
CHILDREN = 3
#: How long ChaosDeadlineFlow and ChaosReminderFlow wait for their ``reply`` (seconds).
REPLY_TIMEOUT = float(os.environ.get("GENEVA_CHAOS_REPLY_TIMEOUT", "3"))


class ChaosTenantFlow(Workflow):
    """load → call_partner → store, every step under the tenant's concurrency limit (at most
    TENANT_SLOTS in progress per tenant) and ``call_partner`` under the tenant's rate limit too.
    The bodies dawdle longer than the others: a tenant's backlog queues up behind its slots."""

    may_proceed_without_hero = True
    concurrency_limit = ConcurrencyLimit("chaos-tenant", limit=TENANT_SLOTS, key="tenant")

    def tenant(self) -> str:
        return f"t{self.id % TENANTS}"

    @step
    def load(self) -> None:
        _write(self, "load")
        time.sleep(random.uniform(0.2, 2 * DAWDLE))

    @step(
        rate_limit=RateLimit(
            "chaos-partner",
            limit=PARTNER_CALLS,
            per=timedelta(seconds=PARTNER_WINDOW),
            key="tenant",
        )
    )
    def call_partner(self) -> None:
        _write(self, "call_partner")
        _dawdle()

    @step
    def store(self) -> None:
        _write(self, "store")
        time.sleep(random.uniform(0.2, 2 * DAWDLE))


class ChaosChildFlow(Workflow):
    """A child of ChaosFanOutFlow: one step."""

    may_proceed_without_hero = True

    @step
    def ship(self) -> None:
        _write(self, "ship")
        _dawdle()


class ChaosFanOutFlow(Workflow):
    """fan_out starts CHILDREN children in its own transaction; ``join`` waits for all of them
    (a canceled child pauses the parent: operators resume it, and the join runs anyway)."""

    may_proceed_without_hero = True

    @step
    def fan_out(self) -> None:
        _write(self, "fan_out")
        for _ in range(CHILDREN):
            self.start_child(ChaosChildFlow, allow_multiple=True)
        _dawdle()

    @step(wait_for_children=True, on_child_failure="pause")
    def join(self) -> None:
        _write(self, "join")
        _dawdle()


class ChaosDeadlineFlow(Workflow):
    """ask → reply (waits REPLY_TIMEOUT s for signal ``reply``, then is skipped) → close. The
    harness answers some in time, some late and some never."""

    may_proceed_without_hero = True

    @step
    def ask(self) -> None:
        _write(self, "ask")
        _dawdle()

    @step(wait_for="reply", timeout=timedelta(seconds=REPLY_TIMEOUT), on_timeout="skip")
    def reply(self) -> None:
        assert self.received_signal is not None, f"reply of workflow {self.id} without signal"
        _write(self, "reply")

    @step
    def close(self) -> None:
        _write(self, "close")


class ChaosReminderFlow(Workflow):
    """reply waits REPLY_TIMEOUT s for signal ``reply``; then its body runs anyway
    (``on_timeout="run"``, ``wait_timed_out``), then ``close``."""

    may_proceed_without_hero = True

    @step(wait_for="reply", timeout=timedelta(seconds=REPLY_TIMEOUT), on_timeout="run")
    def reply(self) -> None:
        if self.wait_timed_out:
            assert self.received_signal is None, f"timed-out reply of {self.id} with a signal"
        else:
            assert self.received_signal is not None, f"reply of workflow {self.id} without signal"
        _write(self, "reply")
        _dawdle()

    @step
    def close(self) -> None:
        _write(self, "close")


class ChaosBurstFlow(Workflow):
    """One short step: the flood of messages the backlog faults queue up."""

    may_proceed_without_hero = True

    @step
    def blip(self) -> None:
        _write(self, "blip")
        time.sleep(random.uniform(0.01, 0.05))


#: The plain steps that write exactly one row per attempt.
PLAIN_STEPS = {
    "ChaosLedgerFlow": ("a", "b", "gate", "c"),
    "ChaosWalkFlow": ("done",),
    "ChaosTenantFlow": ("load", "call_partner", "store"),
    "ChaosChildFlow": ("ship",),
    "ChaosFanOutFlow": ("fan_out", "join"),
    "ChaosDeadlineFlow": ("ask", "reply", "close"),
    "ChaosReminderFlow": ("reply", "close"),
    "ChaosBurstFlow": ("blip",),
}
#: Outcomes of an execution whose body's writes commit with it: success, and the completed
#: run of an ``on_timeout="run"`` step (outcome ``timed_out``).
COMMITTING_OUTCOMES = ("success", "timed_out")


def ledger_violations(connection: Connection) -> tuple[list[str], list[str], dict[str, int]]:
    """(lost, doubled, figures): the ledger counted against the executions.

    Plain steps: an execution that committed ``success`` has exactly one row; any other
    execution (failed, paused, canceled, skipped, recovered, …) has none - its attempt was
    discarded, so its write must have been rolled back. The resumable walk: every item is
    committed at most once per walk (a chain of executions continuing one another's cursor),
    and exactly once when the walk succeeded.
    """
    executions = {
        row.id: row
        for row in connection.execute(
            select(
                StepExecution.id,
                StepExecution.workflow_id,
                StepExecution.step_name,
                StepExecution.state,
                StepExecution.outcome,
                StepExecution.continues_from_id,
            )
        )
    }
    rows = list(
        connection.execute(
            select(LEDGER.c.workflow_id, LEDGER.c.step_name, LEDGER.c.execution_id, LEDGER.c.item)
        )
    )
    types = {row.id: row.type for row in connection.execute(select(Workflow.id, Workflow.type))}
    lost: list[str] = []
    doubled: list[str] = []
    per_execution: Counter[int] = Counter()
    #: Which outcomes the discarded attempts that kept their rows ended with.
    discarded: Counter[str] = Counter()

    def walk_of(execution_id: int) -> int:
        # One walk is a chain of executions each continuing from its predecessor's cursor;
        # an operator's resume_at("walk") starts a new walk from the first item (a new root).
        seen = 0
        while seen < 10_000:
            ex = executions.get(execution_id)
            if ex is None or ex.continues_from_id is None:
                return execution_id
            execution_id, seen = int(ex.continues_from_id), seen + 1
        return execution_id

    items: defaultdict[int, Counter[int]] = defaultdict(Counter)
    for row in rows:
        if row.item is None:
            per_execution[row.execution_id] += 1
        else:
            items[walk_of(row.execution_id)][row.item] += 1
    for execution_id, count in per_execution.items():
        ex = executions.get(execution_id)
        if ex is None:
            doubled.append(f"execution {execution_id}: {count} row(s) but no such execution")
            continue
        label = f"execution {ex.id} (workflow {ex.workflow_id}, step {ex.step_name})"
        if ex.outcome not in COMMITTING_OUTCOMES or ex.state != "completed":
            discarded[f"rows_of_{ex.outcome}_attempts"] += 1
            doubled.append(
                f"{label}: {count} row(s) committed by an attempt that ended "
                f"{ex.state}/{ex.outcome} (a discarded attempt's writes)"
            )
        elif count > 1:
            doubled.append(f"{label}: {count} rows for one successful attempt")
    successes = 0
    for ex in executions.values():
        plain = PLAIN_STEPS.get(types.get(ex.workflow_id, ""), ())
        committed = ex.state == "completed" and ex.outcome in COMMITTING_OUTCOMES
        if committed and ex.step_name in plain:
            successes += 1
            if per_execution[ex.id] == 0:
                lost.append(
                    f"execution {ex.id} (workflow {ex.workflow_id}, step {ex.step_name}): "
                    "committed success without its row"
                )
    walked = {
        walk_of(ex.id): ex.workflow_id
        for ex in executions.values()
        if ex.step_name == "walk" and ex.outcome == "success"
    }
    for root, counter in items.items():
        for item, count in sorted(counter.items()):
            if count > 1:
                doubled.append(
                    f"walk from execution {root} (workflow {executions[root].workflow_id}): "
                    f"item {item} committed {count} times"
                )
    for root, workflow_id in walked.items():
        missing = [i for i in range(WALK_ITEMS) if items[root][i] == 0]
        if missing:
            lost.append(
                f"walk from execution {root} (workflow {workflow_id}) succeeded without "
                f"items {missing}"
            )
    figures = {
        "ledger_rows": len(rows),
        "successful_executions": successes,
        "walks_completed": len(walked),
        **discarded,
    }
    return lost, doubled, figures


def describe(row: Any) -> str:
    return f"{row.workflow_id}:{row.step_name}:{row.execution_id}"
