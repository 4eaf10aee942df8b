"""B1 / B10: engine bookkeeping per step on SQLite (in-process executor) vs the raw floor.

The raw floor is the physical minimum for one step on the same database in the same run:
3 transactions, 5 row writes (insert scheduled + update workflow; claim; complete + update
workflow), issued as plain SQL through SQLAlchemy Core (the step3 lifecycle of
the original peer benchmark scripts).

The engine runs workflows of no-op steps through the real executor, one session per execution
as a worker does. The transport is an in-process queue: the "run execution N" messages the
engine sends after each commit are run in order, exactly as a worker would receive them, so
the figure is the engine's own bookkeeping (create, prepare, body, finalize, after-commit send)
and nothing of a harness lookup.

    .venv/bin/python -m bench.engine_inprocess_sqlite [--workflows 500] [--json out.json]
    .venv/bin/python -m bench.engine_inprocess_sqlite --workflows 150 --guard-rounds 15 --min-ratio 0.15  # B10

Reports ms/step (creation included, 3-step workflows), the marginal ms per step (slope between
the 3- and 10-step workflow medians, as the DBOS peer is measured), statements and commits per
step, and the raw/engine ratio (``--repeats``: medians over alternating full runs).

B10 (``--guard-rounds``): short raw and engine chunks alternate, so both see the same machine
load; the engine's marginal cost per step (3- vs 10-step workflows, as B1 defines it) from
each side's best round decides (interference only adds time); ``--min-ratio`` exits 1 below.

``--tracing noop`` sets the API's no-op provider (the engine must trace nothing and cost
nothing more); ``--tracing sdk`` configures OpenTelemetry's SDK first, as an application would (docs/MANUAL.md,
"Tracing"): a ``BatchSpanProcessor`` whose exporter drops the spans, so the figure is the
engine's tracing and the SDK's span handling, without an exporter's encoding or network;
``--tracing sdk-json`` exports through the SDK's console exporter to /dev/null (every span
encoded as JSON, an upper bound for an OTLP exporter's encoding). Process CPU time counts the
batch processor's thread too. Compare with runs without the option.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from sqlalchemy import event, text

from bench.common import COUNTS_OFF_ENV, apply_counts_off
from geneva_drive import Workflow, db, inline, step
from geneva_drive.config import settings
from geneva_drive.executor import execute
from geneva_drive.models import Base
from geneva_drive.transport import Message, set_transport


class BenchWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        pass

    @step
    def two(self) -> None:
        pass

    @step
    def three(self) -> None:
        pass


class BenchTenWorkflow(Workflow):
    may_proceed_without_hero = True


for _i in range(10):
    BenchTenWorkflow.add_step(f"s{_i}", lambda self: None)


class InlineQueue:
    """The transport: messages sent after commit are queued here and run in order."""

    def __init__(self) -> None:
        self.queue: deque[int] = deque()

    def send(self, message: Message) -> None:
        self.queue.append(message.execution_id)


class RawFloor:
    """The raw 3-transaction, 5-row step lifecycle on its own SQLite file (same pragmas)."""

    def __init__(self, path: Path) -> None:
        self.engine = db.make_engine(f"sqlite:///{path}")
        with self.engine.begin() as c:
            c.execute(text("DROP TABLE IF EXISTS wf"))
            c.execute(text("DROP TABLE IF EXISTS se"))
            c.execute(
                text("CREATE TABLE wf (id INTEGER PRIMARY KEY, state TEXT, cur TEXT, updated REAL)")
            )
            c.execute(
                text(
                    "CREATE TABLE se (id INTEGER PRIMARY KEY AUTOINCREMENT, wf INTEGER, name TEXT, "
                    "state TEXT, sched REAL, started REAL, done REAL, created REAL)"
                )
            )
            c.execute(text("CREATE INDEX se_wf ON se(wf)"))
            c.execute(text("CREATE INDEX se_state ON se(state, sched)"))
            c.execute(text("INSERT INTO wf (id, state, updated) VALUES (1, 'ready', 0)"))

    def run(self, n: int, clock: Any = time.perf_counter) -> float:
        """ms per step over ``n`` steps (wall clock, or ``clock``)."""
        engine = self.engine
        started = clock()
        for _ in range(n):
            now = time.time()
            with engine.begin() as c:
                sid = c.execute(
                    text(
                        "INSERT INTO se (wf, name, state, sched, created) VALUES (1,'s','scheduled',:n,:n)"
                    ),
                    {"n": now},
                ).lastrowid
                c.execute(text("UPDATE wf SET cur='s', updated=:n WHERE id=1"), {"n": now})
            with engine.begin() as c:
                c.execute(
                    text(
                        "UPDATE se SET state='in_progress', started=:n WHERE id=:i AND state='scheduled'"
                    ),
                    {"n": now, "i": sid},
                )
            with engine.begin() as c:
                c.execute(
                    text("UPDATE se SET state='completed', done=:n WHERE id=:i"),
                    {"n": now, "i": sid},
                )
                c.execute(text("UPDATE wf SET state='ready', updated=:n WHERE id=1"), {"n": now})
        return (clock() - started) * 1000 / n

    def close(self) -> None:
        self.engine.dispose()


def raw_floor(path: Path, n: int) -> float:
    """ms per step for the raw 3-transaction, 5-row lifecycle."""
    raw = RawFloor(path)
    try:
        return raw.run(n)
    finally:
        raw.close()


class EngineBench:
    def __init__(self, path: Path, count: bool = True) -> None:
        self.engine = db.configure(f"sqlite:///{path}")
        Base.metadata.create_all(self.engine)
        self.inline = InlineQueue()
        set_transport(self.inline)
        settings.enqueue_after_commit = True
        self.counts = {"statements": 0, "commits": 0}
        if not count:  # the guard times the engine without the harness's own listeners
            return

        @event.listens_for(self.engine, "before_cursor_execute")
        def _count(*_args: object) -> None:
            self.counts["statements"] += 1

        @event.listens_for(self.engine, "commit")
        def _commit(*_args: object) -> None:
            self.counts["commits"] += 1

    def one_workflow(self, cls: type[Workflow]) -> int:
        with db.new_session() as session:
            cls.create(session=session, allow_multiple=True)
            session.commit()
        steps = 0
        queue = self.inline.queue
        while queue:
            # As a worker runs a message: immediately-due successors inline (engine/inline.py)
            # unless GENEVA_INLINE_SUCCESSORS is off; the budget counts the steps run.
            budget = inline.budget()
            execute(queue.popleft(), budget=budget)
            steps += budget.steps if budget is not None else 1
        return steps

    def run(self, workflows: int, cap_s: float = 120.0) -> dict[str, Any]:
        for _ in range(20):  # warm-up
            self.one_workflow(BenchWorkflow)
            self.one_workflow(BenchTenWorkflow)
        self.counts["statements"] = self.counts["commits"] = 0
        per_workflow: list[float] = []
        steps_total = 0
        started = time.perf_counter()
        for _ in range(workflows):
            t0 = time.perf_counter()
            steps_total += self.one_workflow(BenchWorkflow)
            per_workflow.append((time.perf_counter() - t0) * 1000)
            if time.perf_counter() - started > cap_s:
                break
        elapsed = time.perf_counter() - started
        statements = self.counts["statements"]
        commits = self.counts["commits"]
        ten: list[float] = []
        t_ten = time.perf_counter()
        for _ in range(max(5, len(per_workflow) // 3)):
            t0 = time.perf_counter()
            self.one_workflow(BenchTenWorkflow)
            ten.append((time.perf_counter() - t0) * 1000)
            if time.perf_counter() - t_ten > cap_s / 2:
                break
        p50_3 = statistics.median(per_workflow)
        p50_10 = statistics.median(ten)
        return {
            "workflows": len(per_workflow),
            "steps": steps_total,
            "ms_per_step": elapsed * 1000 / steps_total,
            "steps_per_s": steps_total / elapsed,
            "workflows_per_s": len(per_workflow) / elapsed,
            "wf3_ms_p50": p50_3,
            "wf3_ms_p99": pct(per_workflow, 99),
            "wf10_ms_p50": p50_10,
            "marginal_ms_per_step": (p50_10 - p50_3) / 7,
            "statements_per_step": statements / steps_total,
            "commits_per_step": commits / steps_total,
        }

    def close(self) -> None:
        set_transport(None)
        self.engine.dispose()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[k]


def measure(workflows: int, repeats: int = 1, raw_n: int = 2000) -> dict[str, Any]:
    """Alternate raw floor and engine ``repeats`` times; medians of each figure."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        bench = EngineBench(Path(tmp) / "engine.sqlite3")
        try:
            for _ in range(repeats):
                raw = raw_floor(Path(tmp) / "raw.sqlite3", raw_n)
                result = bench.run(workflows)
                result["raw_ms_per_step"] = raw
                result["engine_vs_raw"] = raw / result["ms_per_step"]
                runs.append(result)
        finally:
            bench.close()
    merged = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    merged["repeats"] = repeats
    merged["engine_vs_raw_all"] = [round(r["engine_vs_raw"], 3) for r in runs]
    return merged


def guard(workflows: int, rounds: int) -> dict[str, Any]:
    """B10: ``rounds`` alternating raw and engine chunks; the engine's marginal cost per step.

    B1's figure is the *marginal* ms per step (the slope between 3- and 10-step workflows), so
    creating the workflow is not charged to its steps. Each round times the raw floor, a chunk
    of 3-step workflows and a chunk of 10-step workflows, in process CPU time (with WAL and
    ``synchronous=NORMAL`` neither side waits on I/O, and CPU time does not depend on how much
    of the machine other processes take).

    The decision uses each chunk's best round (timeit's rule: interference from other
    processes only ever adds time, so the fastest round is the closest to the intrinsic cost).
    A real regression raises the best rounds as much as the medians; machine noise does not,
    so a loaded CI box cannot flip the guard. Medians are reported too.
    """
    raw_ms: list[float] = []
    three_ms: list[float] = []
    ten_ms: list[float] = []
    total_ms: list[float] = []
    per_round = max(3, workflows // rounds)
    with tempfile.TemporaryDirectory() as tmp:
        bench = EngineBench(Path(tmp) / "engine.sqlite3", count=False)
        raw = RawFloor(Path(tmp) / "raw.sqlite3")
        try:
            for _ in range(10):  # warm-up
                bench.one_workflow(BenchWorkflow)
                bench.one_workflow(BenchTenWorkflow)
            raw.run(60)
            for _ in range(rounds):
                raw_ms.append(raw.run(per_round * 3, clock=time.process_time))
                t0 = time.process_time()
                steps = sum(bench.one_workflow(BenchWorkflow) for _ in range(per_round))
                three = (time.process_time() - t0) * 1000
                t0 = time.process_time()
                tens = sum(bench.one_workflow(BenchTenWorkflow) for _ in range(per_round))
                ten = (time.process_time() - t0) * 1000
                three_ms.append(three / per_round)
                ten_ms.append(ten / per_round)
                total_ms.append((three + ten) / (steps + tens))
        finally:
            raw.close()
            bench.close()
    marginal = (min(ten_ms) - min(three_ms)) / 7
    marginal_median = (statistics.median(ten_ms) - statistics.median(three_ms)) / 7
    return {
        "rounds": rounds,
        "workflows_per_round": per_round,
        "clock": "process CPU time",
        "cpu_ms_per_step": marginal,
        "raw_cpu_ms_per_step": min(raw_ms),
        "engine_vs_raw": min(raw_ms) / marginal,
        "cpu_ms_per_step_with_create": min(total_ms),
        "cpu_ms_per_step_median": marginal_median,
        "raw_cpu_ms_per_step_median": statistics.median(raw_ms),
        "engine_vs_raw_median": statistics.median(raw_ms) / marginal_median,
    }


def configure_tracing(mode: str) -> None:
    """OpenTelemetry's SDK as an application configures it (``--tracing``); "off" leaves the
    API's default provider and "noop" sets its no-op one: with either the engine traces
    nothing."""
    if mode == "off":
        return
    from opentelemetry import trace

    if mode == "noop":
        trace.set_tracer_provider(trace.NoOpTracerProvider())
        return
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    exporter: SpanExporter = Dropped()
    if mode == "sdk-json":
        sink = open(os.devnull, "w")  # noqa: SIM115 - open for the process's life
        exporter = ConsoleSpanExporter(
            out=sink, formatter=lambda span: ReadableSpan.to_json(span, indent=None) + "\n"
        )
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--min-ratio", type=float, default=None)
    parser.add_argument(
        "--guard-rounds",
        type=int,
        default=0,
        help="B10 mode: this many interleaved raw/engine rounds over --workflows (best rounds, marginal cost)",
    )
    parser.add_argument(
        "--counts-off",
        action="store_true",
        help="replace the per-(class, state) counts upsert by a no-op, as before migration "
        "0010 (alternate runs with and without to see what the counts cost)",
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "noop", "sdk", "sdk-json"),
        default="off",
        help='configure OpenTelemetry\'s SDK first (docs/MANUAL.md, "Tracing"): spans dropped '
        "by the exporter (sdk) or encoded as JSON to /dev/null (sdk-json)",
    )
    args = parser.parse_args()
    configure_tracing(args.tracing)
    if args.counts_off:
        os.environ[COUNTS_OFF_ENV] = "1"
    counts_off = apply_counts_off()
    result = (
        guard(args.workflows, args.guard_rounds)
        if args.guard_rounds
        else measure(args.workflows, args.repeats)
    )
    result["counts_off"] = counts_off  # an exported GENEVA_BENCH_COUNTS_OFF=1 shows here
    if args.tracing != "off":
        result["tracing"] = args.tracing
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key:22} {value:10.3f}")
        else:
            print(f"{key:22} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.min_ratio is not None and result["engine_vs_raw"] < args.min_ratio:
        print(
            f"FAIL: engine is at {result['engine_vs_raw']:.1%} of the raw floor "
            f"(marginal cost per step, best rounds), below {args.min_ratio:.0%}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
