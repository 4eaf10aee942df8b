"""Two ways to hand a finished step's successor to the same worker, measured.

* **commit first, then claim** (what the engine does, engine/inline.py): finalize of step N
  commits (synchronously) with N+1 scheduled and unsent; N+1 is then claimed in its own
  transaction (lock, prepare checks, start; committed without waiting for the WAL flush).
* **savepoint**: finalize of N, then ``SAVEPOINT``, N+1's lock, prepare and start, ``RELEASE``,
  and one synchronous commit for both. A database error in N+1's prepare would roll back to
  the savepoint only. Measured here with a harness-only driver of the executor's phases (not
  in the engine).

Both run the same 10-step no-op workflows in-process on PostgreSQL, one after the other in
alternating rounds; the figures are wall and CPU milliseconds per step and SQL statements and
commits per step (creation excluded: the chain is timed from its first execution).

    .venv/bin/python -m bench.probe_inline_merge [--rounds 5] [--workflows 40] [--backend postgres|sqlite]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench.common import OUT, drop_pg_schema, env_info, pg_schema_url, reset_pg_schema

SCHEMA = os.environ.get("GENEVA_BENCH_SCHEMA", "geneva_bench") + "_merge"


def _flows() -> Any:
    from geneva_drive import Workflow, step

    class MergeTenFlow(Workflow):
        may_proceed_without_hero = True

    for index in range(10):

        def body(self: Workflow) -> None:
            return None

        MergeTenFlow.add_step(f"m{index}", body)
    _ = step
    return MergeTenFlow


def commit_first(first_id: int) -> int:
    from geneva_drive import executor, inline

    budget = inline.Budget(max_steps=1000, max_seconds=60.0)
    executor.execute(first_id, budget=budget)
    return budget.steps


def savepoint(first_id: int) -> int:
    """The executor's phases with N's finalize and N+1's start in one transaction."""
    from geneva_drive import db, inline
    from geneva_drive.executor import Executor

    budget = inline.Budget(max_steps=1000, max_seconds=60.0)
    session = db.new_session()
    steps = 1
    try:
        current = Executor(session, first_id)
        current.budget = budget
        locked = current._lock()
        assert locked is not None
        workflow, execution = locked
        prepared = current.prepare(workflow, execution)
        current._commit(asynchronous=True)
        while prepared is not None:
            step_def, signal = prepared
            result = current.run_body(workflow, execution, step_def, signal)
            inline.arm(session, budget)
            current.finalize(workflow, execution, step_def, result)
            current._settle_inline(runs_next=True)
            successor = current.successor_id
            if successor is None:
                current._commit()
                break
            nested = session.begin_nested()
            following = Executor(session, successor)
            following.budget = budget
            locked = following._lock()
            assert locked is not None
            workflow, execution = locked
            prepared = following.prepare(workflow, execution)
            nested.commit()
            current._commit()  # one synchronous commit: N's outcome and N+1's start
            current = following
            steps += 1
    finally:
        session.close()
    return steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workflows", type=int, default=40)
    args = parser.parse_args()
    import tempfile

    from sqlalchemy import event

    from geneva_drive import db
    from geneva_drive.models import Base
    from geneva_drive.transport import RecordingTransport, set_transport

    tmp = tempfile.mkdtemp(prefix="geneva-merge-")
    if args.backend == "postgres":
        reset_pg_schema(SCHEMA)
        url = pg_schema_url(SCHEMA)
    else:
        url = f"sqlite:///{tmp}/merge.sqlite3"
    engine = db.configure(url)
    Base.metadata.create_all(engine)
    transport = RecordingTransport()
    set_transport(transport)
    flow = _flows()
    counts = {"statements": 0, "commits": 0}

    @event.listens_for(engine, "before_cursor_execute")
    def _count(*_a: object) -> None:
        counts["statements"] += 1

    @event.listens_for(engine, "commit")
    def _commit(*_a: object) -> None:
        counts["commits"] += 1

    def one(mode: Any) -> tuple[float, float, int, int, int]:
        with db.transaction() as session:
            flow.create(session=session, allow_multiple=True)
        first = transport.messages[-1].execution_id
        transport.clear()
        counts["statements"] = counts["commits"] = 0
        wall, cpu = time.perf_counter(), time.process_time()
        steps = mode(first)
        return (
            time.perf_counter() - wall,
            time.process_time() - cpu,
            steps,
            counts["statements"],
            counts["commits"],
        )

    modes = {"commit_first": commit_first, "savepoint": savepoint}
    results: dict[str, dict[str, list[float]]] = {
        m: {"wall_ms": [], "cpu_ms": [], "statements": [], "commits": []} for m in modes
    }
    try:
        for mode in modes.values():  # warm-up
            for _ in range(5):
                one(mode)
        for round_no in range(args.rounds):
            names = list(modes) if round_no % 2 == 0 else list(reversed(modes))
            for name in names:
                wall = cpu = 0.0
                steps = statements = commits = 0
                for _ in range(args.workflows):
                    w, c, s, st, co = one(modes[name])
                    assert s == 10, (name, s)
                    wall, cpu = wall + w, cpu + c
                    steps, statements, commits = steps + s, statements + st, commits + co
                results[name]["wall_ms"].append(wall * 1000 / steps)
                results[name]["cpu_ms"].append(cpu * 1000 / steps)
                results[name]["statements"].append(statements / steps)
                results[name]["commits"].append(commits / steps)
    finally:
        set_transport(None)
        engine.dispose()
        if args.backend == "postgres":
            drop_pg_schema(SCHEMA)
    summary = {
        name: {key: round(statistics.median(values), 3) for key, values in figures.items()}
        | {"wall_ms_rounds": [round(v, 3) for v in figures["wall_ms"]]}
        for name, figures in results.items()
    }
    payload = {"env": env_info(), "backend": args.backend, "rounds": args.rounds,
               "workflows_per_round": args.workflows, "modes": summary}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"probe_inline_merge_{args.backend}.json").write_text(json.dumps(payload, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
