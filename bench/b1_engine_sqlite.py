"""B1 / B10: engine bookkeeping per step on SQLite (in-process executor) vs the raw floor.

The raw floor is the physical minimum for one step on the same database in the same run:
3 transactions, 5 row writes (insert scheduled + update workflow; claim; complete + update
workflow), issued as plain SQL. The engine runs workflows of three no-op steps through the
real executor, one session per execution as a worker would, with no transport.

    .venv/bin/python bench/b1_engine_sqlite.py [--workflows 500] [--json out.json]
                                                [--min-ratio 0.15]   # B10 guard: exit 1 below

Prints ms/step, steps/s, statements and commits per step, and the engine/raw ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import event, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import Workflow, db, step  # noqa: E402
from engine.config import settings  # noqa: E402
from engine.executor import execute  # noqa: E402
from engine.models import Base  # noqa: E402
from engine.scheduling import current_execution  # noqa: E402
from engine.transport import NullTransport, set_transport  # noqa: E402


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


def raw_floor(path: Path, n: int) -> float:
    """ms per step for the raw 3-transaction, 5-row lifecycle."""
    engine = db.make_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE wf (id INTEGER PRIMARY KEY, state TEXT, cur TEXT, updated REAL)"))
        c.execute(
            text(
                "CREATE TABLE se (id INTEGER PRIMARY KEY AUTOINCREMENT, wf INTEGER, name TEXT, "
                "state TEXT, sched REAL, started REAL, done REAL, created REAL)"
            )
        )
        c.execute(text("CREATE INDEX se_wf ON se(wf)"))
        c.execute(text("CREATE INDEX se_state ON se(state, sched)"))
        c.execute(text("INSERT INTO wf (id, state, updated) VALUES (1, 'ready', 0)"))
    started = time.perf_counter()
    for _ in range(n):
        now = time.time()
        with engine.begin() as c:
            sid = c.execute(
                text("INSERT INTO se (wf, name, state, sched, created) VALUES (1,'s','scheduled',:n,:n)"),
                {"n": now},
            ).lastrowid
            c.execute(text("UPDATE wf SET cur='s', updated=:n WHERE id=1"), {"n": now})
        with engine.begin() as c:
            c.execute(
                text("UPDATE se SET state='in_progress', started=:n WHERE id=:i AND state='scheduled'"),
                {"n": now, "i": sid},
            )
        with engine.begin() as c:
            c.execute(text("UPDATE se SET state='completed', done=:n WHERE id=:i"), {"n": now, "i": sid})
            c.execute(text("UPDATE wf SET state='ready', updated=:n WHERE id=1"), {"n": now})
    elapsed = time.perf_counter() - started
    engine.dispose()
    return elapsed * 1000 / n


def engine_run(path: Path, workflows: int) -> dict[str, float]:
    engine = db.configure(f"sqlite:///{path}")
    Base.metadata.create_all(engine)
    set_transport(NullTransport())
    settings.enqueue_after_commit = True
    counts = {"statements": 0, "commits": 0}

    @event.listens_for(engine, "before_cursor_execute")
    def _count(*_args: object) -> None:
        counts["statements"] += 1

    @event.listens_for(engine, "commit")
    def _commit(*_args: object) -> None:
        counts["commits"] += 1

    def one_workflow() -> int:
        with db.new_session() as session:
            wf = BenchWorkflow.create(session=session)
            session.commit()
            wf_id = wf.id
        steps = 0
        while True:
            with db.new_session() as session:
                wf = session.get(Workflow, wf_id)
                assert wf is not None
                ex = current_execution(session, wf)
                ex_id = ex.id if ex is not None else None
            if ex_id is None:
                return steps
            execute(ex_id)
            steps += 1

    for _ in range(20):  # warm-up
        one_workflow()
    counts["statements"] = counts["commits"] = 0
    per_workflow: list[float] = []
    steps_total = 0
    started = time.perf_counter()
    for _ in range(workflows):
        t0 = time.perf_counter()
        steps_total += one_workflow()
        per_workflow.append((time.perf_counter() - t0) * 1000)
        if time.perf_counter() - started > 120:
            break
    elapsed = time.perf_counter() - started
    done = len(per_workflow)
    engine.dispose()
    return {
        "workflows": done,
        "steps": steps_total,
        "ms_per_step": elapsed * 1000 / steps_total,
        "steps_per_s": steps_total / elapsed,
        "workflow_ms_p50": statistics.median(per_workflow),
        # The harness's own lookups (create + current_execution per step) are included; they
        # are what a dispatcher would do too.
        "statements_per_step": counts["statements"] / steps_total,
        "commits_per_step": counts["commits"] / steps_total,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--json")
    parser.add_argument("--min-ratio", type=float, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_floor(Path(tmp) / "raw.sqlite3", 2000)
        result = engine_run(Path(tmp) / "engine.sqlite3", args.workflows)
    result["raw_ms_per_step"] = raw
    result["engine_vs_raw"] = raw / result["ms_per_step"]
    for key, value in result.items():
        print(f"{key:22} {value:10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if args.min_ratio is not None and result["engine_vs_raw"] < args.min_ratio:
        print(f"FAIL: engine is below {args.min_ratio:.0%} of the raw floor", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
