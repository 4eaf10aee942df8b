"""A bounded soak: thousands of small workflows with random waits, failures, signals and
operator actions against a pool of real worker processes that are SIGKILLed and replaced
along the way; then every workflow must settle and the invariant checker must find nothing.

``GENEVA_SOAK_SECONDS`` (default 20) is the length of the injection phase; settling after it
is bounded too. ``GENEVA_SOAK_RECORD=1`` writes the figures into bench/RESULTS.md ("Soak").
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from geneva_drive import db, health, housekeeping
from geneva_drive.config import settings
from geneva_drive.errors import EngineError
from geneva_drive.models import Signal, StepExecution
from geneva_drive.transport import NullTransport
from geneva_drive.workflow import Workflow
from tests.integration.conftest import BIN, Process, SharedDatabase, process_env
from tests.reliability.crash_flows import (
    SOAK_WRITING_STEPS,
    Ledger,
    SoakChainWorkflow,
    SoakWorkflow,
)
from tests.reliability.invariants import check_invariants, check_writes
from tests.reliability.ledger import WRITES, WRITES_METADATA

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODULES = "tests.integration.flows,tests.reliability.crash_flows"
SECONDS = float(os.environ.get("GENEVA_SOAK_SECONDS", "20"))
#: Settling ends when every workflow is finished or canceled; it fails when nothing moved for
#: STALL_SECONDS (a stuck workflow), and never runs longer than SETTLE_CAP_SECONDS.
STALL_SECONDS = 30.0
SETTLE_CAP_SECONDS = 300.0
WORKERS = 2
CONCURRENCY = 4
#: Ongoing workflows kept in flight while injecting (new ones are created as others end).
BACKLOG = int(os.environ.get("GENEVA_SOAK_BACKLOG", "150"))


@dataclass
class Figures:
    backend: str = ""
    seconds: float = 0.0
    settle_seconds: float = 0.0
    workflows: int = 0
    finished: int = 0
    canceled: int = 0
    executions: int = 0
    body_runs: int = 0
    step_failures: int = 0
    random_waits: int = 0
    signals: int = 0
    duplicate_signals: int = 0
    worker_kills: int = 0
    operator_actions: Counter[str] = field(default_factory=Counter)
    operator_refusals: int = 0
    #: caller transactions chosen as a deadlock victim and run again (InnoDB)
    deadlocks_retried: int = 0
    recovered_by_housekeeping: int = 0
    inline_hand_offs: int = 0
    #: rows step bodies wrote through self.session that committed (the ledger of writes)
    committed_writes: int = 0
    anomalies: list[str] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return (
            self.step_failures
            + self.worker_kills
            + sum(self.operator_actions.values())
            + self.duplicate_signals
        )

    def line(self) -> str:
        return (
            f"soak[{self.backend}] {self.seconds:.0f}s of faults + {self.settle_seconds:.0f}s "
            f"to settle: {self.workflows} workflows "
            f"({self.finished} finished, {self.canceled} canceled), {self.executions} step "
            f"executions, {self.body_runs} step bodies run; faults injected: {self.faults} "
            f"({self.step_failures} step failures, {self.worker_kills} worker SIGKILLs, "
            f"{sum(self.operator_actions.values())} operator actions "
            f"[{self.operator_refusals} refused], {self.duplicate_signals} duplicate signals, "
            f"{self.random_waits} random waits); {self.signals} signals; "
            f"{self.inline_hand_offs} steps run inline after their predecessor; "
            f"{self.recovered_by_housekeeping} executions recovered by housekeeping; "
            f"{self.committed_writes} step writes committed; "
            f"anomalies: {len(self.anomalies)}"
        )


class Pool:
    def __init__(self, database: SharedDatabase, directory: Path, procs: list[Process]) -> None:
        self.database = database
        self.directory = directory
        self.procs = procs
        self.log = directory / "steps.log"
        self.workers: list[Process] = []
        self.started = 0

    def start(self) -> Process:
        self.started += 1
        process = Process(
            [
                str(BIN / "geneva-drive"),
                "worker",
                "--concurrency",
                str(CONCURRENCY),
                "--poll-interval",
                "0.05",
                "--no-housekeeping",
            ],
            process_env(self.database, self.log, GENEVA_WORKFLOW_MODULES=MODULES),
            self.directory / f"worker-{self.started}.log",
        )
        self.procs.append(process)
        process.wait_for_output("embedded worker running", timeout=90)
        self.workers.append(process)
        return process

    def kill_one(self, rng: random.Random) -> None:
        victim = rng.choice(self.workers)
        victim.kill()
        self.workers.remove(victim)

    def stop(self) -> None:
        for process in self.workers:
            process.stop()
        self.workers.clear()


def _ids(session, *conditions) -> list[int]:
    return list(session.scalars(select(Workflow.id).where(*conditions)))


def _as_a_caller(work, figures: Figures) -> None:
    """Run ``work`` in a transaction of its own, as an application would: an engine refusal is
    counted, and a deadlock victim (InnoDB picks one even between transactions that lock in
    the same order) is run again, as InnoDB's documentation tells every caller to."""
    for attempt in range(5):
        try:
            with db.transaction() as session:
                work(session)
            return
        except EngineError:
            figures.operator_refusals += 1
            return
        except OperationalError as error:
            if not db.is_deadlock(error) or attempt == 4:
                raise
            figures.deadlocks_retried += 1


def _act(workflow_id: int, action: str, figures: Figures, *args) -> None:
    figures.operator_actions[action] += 1

    def act(session) -> None:
        workflow = session.get(Workflow, workflow_id)
        if workflow is not None:
            getattr(workflow, action)(*args)

    _as_a_caller(act, figures)


def _signal(workflow_id: int, key: str | None, figures: Figures) -> None:
    def deliver(session) -> None:
        workflow = session.get(Workflow, workflow_id)
        if workflow is None:
            return
        signal = workflow.signal("go", {"key": key}, idempotency_key=key)
        figures.signals += 1
        figures.duplicate_signals += int(signal.duplicate_delivery)

    _as_a_caller(deliver, figures)


def _parked(session) -> list[int]:
    return list(
        session.scalars(
            select(StepExecution.workflow_id).where(StepExecution.state == "waiting").limit(200)
        )
    )


def _create(count: int) -> None:
    # One in three is a chain of five immediately-due steps (inline successors).
    with db.transaction() as session:
        for index in range(count):
            cls = SoakChainWorkflow if index % 3 == 0 else SoakWorkflow
            cls.create(session=session, allow_multiple=True)


def _housekeep(figures: Figures) -> None:
    report = housekeeping.run()
    figures.recovered_by_housekeeping += (
        report.stuck_in_progress_recovered + report.stuck_scheduled_recovered
    )
    _doctor(figures)


def _doctor(figures: Figures) -> None:
    """``geneva-drive doctor``'s rules find nothing on a healthy soak, while
    workers are killed and operators act as well as after settling."""
    with db.new_session() as session:
        for finding in health.unexplained(session):
            figures.anomalies.append(
                f"doctor: {finding.workflow_class} #{finding.workflow_id} [{finding.rule}]"
            )


# The injection phase is GENEVA_SOAK_SECONDS long (150 s for a recorded run): the default time
# limit plus three times that phase, for the settling and the checks on a loaded machine.
@pytest.mark.timeout(300 + 3 * SECONDS)
def test_soak(
    shared_database: SharedDatabase,
    short_horizon: None,
    restore_settings: None,
    use_transport,
    processes: list[Process],
    tmp_path: Path,
) -> None:
    use_transport(NullTransport())  # the embedded workers poll the table
    WRITES_METADATA.create_all(shared_database.engine)  # the ledger of committed writes
    settings.stuck_in_progress_threshold = 5  # steps take milliseconds; a killed one is found fast
    settings.stuck_scheduled_threshold = 3600  # pollers never lose a row; nothing to recover
    settings.delete_completed_workflows_after = None  # keep every row for the checks
    rng = random.Random(int(os.environ.get("GENEVA_SOAK_SEED", "20261129")))
    figures = Figures(backend=shared_database.backend)
    pool = Pool(shared_database, tmp_path, processes)
    for _ in range(WORKERS):
        pool.start()

    started = time.monotonic()
    next_kill = started + 6
    next_housekeeping = started + 1
    while time.monotonic() - started < SECONDS:
        with db.new_session() as session:
            ongoing = session.scalar(
                select(func.count()).where(Workflow.state.in_(["ready", "performing", "paused"]))
            )
            ready = _ids(session, Workflow.state.in_(["ready", "performing"]))
            paused = _ids(session, Workflow.state == "paused")
            parked = _parked(session)
        if ongoing < BACKLOG:
            _create(min(50, BACKLOG - ongoing))
        for workflow_id in rng.sample(parked, min(len(parked), 20)):
            key = rng.choice([None, f"k{workflow_id}"])
            _signal(workflow_id, key, figures)
            if key is not None and rng.random() < 0.5:
                _signal(workflow_id, key, figures)  # a webhook retried: deduplicated
        for workflow_id in rng.sample(ready, min(len(ready), 3)):
            _act(
                workflow_id, rng.choice(["pause", "pause", "skip", "cancel", "reattempt"]), figures
            )
        for workflow_id in rng.sample(paused, min(len(paused), 6)):
            action = rng.choice(["resume", "resume", "resume", "skip", "resume_at"])
            if action == "resume_at":
                _act(workflow_id, action, figures, rng.choice(["prepare", "nap", "gate", "finish"]))
            else:
                _act(workflow_id, action, figures)
        now = time.monotonic()
        if now >= next_kill:
            pool.kill_one(rng)
            figures.worker_kills += 1
            pool.start()
            next_kill = now + rng.uniform(4, 8)
        if now >= next_housekeeping:
            _housekeep(figures)
            next_housekeeping = now + 1
        time.sleep(0.1)
    figures.seconds = time.monotonic() - started

    # Settle: no more faults. Operators resume what is paused and deliver the awaited signals.
    settle_started = time.monotonic()
    last_progress, last_count = settle_started, -1
    while time.monotonic() - settle_started < SETTLE_CAP_SECONDS:
        with db.new_session() as session:
            ongoing = _ids(session, Workflow.state.in_(["ready", "performing", "paused"]))
            paused = _ids(session, Workflow.state == "paused")
            parked = _parked(session)
            moved = session.scalar(select(func.count()).select_from(StepExecution))
        if not ongoing:
            break
        if moved != last_count:
            last_progress, last_count = time.monotonic(), moved
        elif time.monotonic() - last_progress > STALL_SECONDS:
            break  # nothing moved: reported below as workflows that never settled
        for workflow_id in paused:
            _act(workflow_id, "resume", figures)
        for workflow_id in parked:
            _signal(workflow_id, None, figures)
        _housekeep(figures)
        time.sleep(0.5)
    figures.settle_seconds = time.monotonic() - settle_started
    pool.stop()
    time.sleep(0.5)
    settings.stuck_in_progress_threshold = 0.1
    _housekeep(figures)  # anything a stopped worker left behind
    with db.new_session() as session:
        for workflow_id in _ids(session, Workflow.state == "paused"):
            _act(workflow_id, "cancel", figures)

    # Figures and checks.
    ledger = Ledger(pool.log)
    with db.new_session() as session:
        states = dict(
            session.execute(select(Workflow.state, func.count()).group_by(Workflow.state)).all()
        )
        figures.executions = session.scalar(select(func.count()).select_from(StepExecution)) or 0
        signals = session.scalar(select(func.count()).select_from(Signal)) or 0
        figures.committed_writes = session.scalar(select(func.count()).select_from(WRITES)) or 0
    figures.workflows = sum(states.values())
    figures.finished = states.get("finished", 0)
    figures.canceled = states.get("canceled", 0)
    figures.body_runs = sum(1 for line in ledger.lines if line[2] == "start")
    figures.step_failures = sum(1 for line in ledger.lines if line[2] == "fail")
    figures.random_waits = sum(1 for line in ledger.lines if line[2] == "rewait")
    figures.inline_hand_offs = sum(1 for line in ledger.lines if line[2] == "handoff")
    report = check_invariants(shared_database.engine, quiescent=True)
    figures.anomalies.extend(report.violations)
    _doctor(figures)
    # The ledger rule: a body's writes commit iff its execution succeeded (none lost, none
    # doubled, none of a failed, discarded or killed attempt).
    figures.anomalies.extend(check_writes(shared_database.engine, WRITES, SOAK_WRITING_STEPS))
    twice = {x: n for x, n in ledger.runs_per_execution("start").items() if n > 1}
    figures.anomalies.extend(f"execution {x} ran its body {n} times" for x, n in twice.items())
    leftover = {k: v for k, v in states.items() if k not in ("finished", "canceled")}
    if leftover:
        figures.anomalies.append(f"workflows that never settled: {leftover}")
    print("\n" + figures.line())
    for anomaly in figures.anomalies[:20]:
        print("  anomaly:", anomaly)
    if os.environ.get("GENEVA_SOAK_RECORD") == "1":
        _record(figures)
    assert signals >= 1 and figures.workflows >= 100
    assert figures.step_failures > 0 and figures.worker_kills > 0 and figures.duplicate_signals > 0
    assert figures.inline_hand_offs > 0, "no step ran inline: the soak must cover inline chains"
    assert not figures.anomalies, "\n".join(figures.anomalies[:50])


def _record(figures: Figures) -> None:
    """Replace this backend's line in the "Soak" section of bench/RESULTS.md."""
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    entry = f"- **{figures.backend}** ({stamp}): {figures.line()}"
    header = "## Soak"
    if header not in text:
        text = text.rstrip("\n") + (
            f"\n\n{header}\n\n`tests/reliability/test_soak.py` (marked integration; "
            "`GENEVA_SOAK_SECONDS` sets the injection phase, 20 s by default, "
            "`GENEVA_SOAK_RECORD=1` updates the lines below). Two embedded worker processes "
            f"(`geneva-drive worker --concurrency {CONCURRENCY}`), one of them SIGKILLed and "
            "replaced every 4-8 s; the test process creates workflows (a backlog of "
            f"{BACKLOG}), delivers signals (half of the keyed ones twice, as a retried "
            "webhook would), "
            "pauses, resumes, skips, cancels, reattempts and resumes-at at random, and runs "
            "housekeeping every second; steps fail 15% of the time (reattempt policy, pause "
            "after 5) and a quarter of the workflows take random reattempt waits; a third of "
            "the workflows are chains of five immediately-due steps, which the workers run "
            "as inline successors (killed mid-chain too). Then it "
            "settles (resumes what is paused, signals what waits), stops the workers and runs "
            "the invariant checker (tests/reliability/invariants.py) plus the body-run ledger "
            "(no execution row ran its body twice) and the ledger of committed writes (each "
            "step writes a row through self.session; exactly the successful executions have "
            "one).\n\n"
        )
    lines = text.split("\n")
    start = lines.index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    section = [x for x in lines[start:end] if not x.startswith(f"- **{figures.backend}**")]
    while section and section[-1] == "":
        section.pop()
    if not section[-1].startswith("- **"):
        section.append("")  # a blank line between the description and the list
    section += [entry, ""]
    path.write_text("\n".join(lines[:start] + section + lines[end:]).rstrip("\n") + "\n")
    # Also as JSON next to the other benchmark results, for bench/report.py to render.
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    payload = {**vars(figures), "operator_actions": dict(figures.operator_actions)}
    payload["line"] = figures.line()
    payload["recorded_at"] = stamp
    (ROOT / "bench" / "results" / f"soak-{figures.backend.lower()}.json").write_text(
        json.dumps(payload, indent=2, default=str) + "\n"
    )
    assert re.search(r"## Soak", path.read_text())
