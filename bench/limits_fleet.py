"""B11: concurrency limits on a Celery fleet (docs/MANUAL.md, "Concurrency and rate limits").

``--keys`` tenants x ``--per-key`` workflows of one ~20 ms step, under
``ConcurrencyLimit("b11-tenant", limit=2, key=<tenant>)``, all created at once, run by one
prefork Celery worker of ``--concurrency`` processes on Redis. Then the same burst without the
limit. Reported:

* the limit never exceeded: per key, the most step bodies whose [start, end] overlap (from the
  bodies' own timestamps, every execution, not a sample);
* throughput (steps/s from the first create to the last body end), limited vs unlimited;
* fairness: the spread of the keys' completion times (the last body end per key, relative to
  the burst's start): min, median, max;
* the cost of a deferral: in this process, executions claimed against a key whose two slots
  are held, each deferred (the executor's whole prepare: locks, claim, commit), ms each.

    GENEVA_BENCH_REDIS_URL=redis://127.0.0.1:6379/1 GENEVA_BENCH_OUT=/tmp/b11 \\
      .venv/bin/python -m bench.limits_fleet --backend postgres [--keys 50 --per-key 200]

The full size (50 x 200) is the default: a burst of 10,000 took 35-48 s at load 2-4 on
the 2-core machine, far longer under load; ``--keys``/``--per-key`` scale it. Results go to ``GENEVA_BENCH_OUT``
(bench/common.write_result).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.common import env_info, write_result


def _overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = most = 0
    for _t, step in edges:
        running += step
        most = max(most, running)
    return most


def _burst(stack: Any, cls: str, count: int, keys: int, timeout: float) -> dict[str, Any]:
    start = time.time()
    created = stack.create(cls, count, per_commit=50)
    ids = [wf for wf, _ in created]
    wanted = [(cls, wf, 1) for wf in ids]
    finished = stack.timings.wait_for(wanted, timeout, sleep=0.2)
    rows = {k: stack.timings.rows[k][0] for k in wanted if k in stack.timings.rows}
    by_key: dict[int, list[tuple[float, float]]] = {}
    for (_cls, wf, _idx), (s, e, _pid) in rows.items():
        by_key.setdefault(wf % keys, []).append((s, e))
    ends = sorted(max(e for _s, e in spans) - start for spans in by_key.values())
    last = max((e for _s, e, _pid in rows.values()), default=start)
    return {
        "workflows": count,
        "finished": finished,
        "ran": len(rows),
        "max_overlap_per_key": max((_overlap(v) for v in by_key.values()), default=0),
        "throughput_steps_s": round(len(rows) / (last - start), 1) if rows else None,
        "wall_s": round(last - start, 2),
        "key_completion_s": {
            "min": round(ends[0], 2) if ends else None,
            "median": round(statistics.median(ends), 2) if ends else None,
            "max": round(ends[-1], 2) if ends else None,
        },
    }


def _deferral_cost(n: int) -> dict[str, Any]:
    """Executions of one key deferred while its two slots are held, in this process."""
    from sqlalchemy import update

    from bench.flows import LimitedFlow
    from geneva_drive import db, executor
    from geneva_drive.models import StepExecution
    from geneva_drive.workflow import Workflow

    # One key for all of them (the key function reads this at creation, in this process).
    os.environ["GENEVA_B11_KEYS"] = "1"
    with db.new_session() as session:
        made = [LimitedFlow.create(session=session, allow_multiple=True) for _ in range(n + 2)]
        session.flush()
        ids = [wf.id for wf in made]
        holders, waiters = ids[:2], ids[2:]
        # Their messages went to the worker at commit; this process claims them first below.
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id.in_(holders))
            .values(state="in_progress")
        )
        session.execute(update(Workflow).where(Workflow.id.in_(holders)).values(state="performing"))
        session.commit()
        execution_ids = [
            session.query(StepExecution.id).filter(StepExecution.workflow_id == wf).scalar()
            for wf in waiters
        ]
    started = time.perf_counter()
    for execution_id in execution_ids:
        executor.execute(execution_id)
    elapsed = time.perf_counter() - started
    with db.new_session() as session:
        deferred = (
            session.query(StepExecution)
            .filter(StepExecution.id.in_(execution_ids), StepExecution.deferred_on.is_not(None))
            .filter(StepExecution.state == "scheduled")
            .count()
        )
    return {
        "executions": len(execution_ids),
        "deferred": deferred,
        "ms_each": round(1000 * elapsed / max(1, len(execution_ids)), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["sqlite", "postgres", "mariadb"], default="postgres")
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--per-key", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    os.environ["GENEVA_B11_KEYS"] = str(args.keys)
    os.environ.setdefault("GENEVA_BENCH_SCHEMA", "geneva_bench_b11")
    from bench.engine_celery import Stack

    count = args.keys * args.per_key
    result: dict[str, Any] = {
        "backend": args.backend,
        "env": env_info(),
        "keys": args.keys,
        "per_key": args.per_key,
        "limit": 2,
        "concurrency": args.concurrency,
    }
    with tempfile.TemporaryDirectory(prefix="geneva-b11-") as workdir:
        stack = Stack(args.backend, workdir, schema=os.environ["GENEVA_BENCH_SCHEMA"])
        try:
            stack.start_worker(args.concurrency)
            result["warm"] = stack.warm_up()
            # Alternated, twice each, so that neither side always runs first on a warming stack.
            for round_ in (1, 2):
                order = ("LimitedFlow", "UnlimitedFlow")
                for cls in order if round_ == 1 else reversed(order):
                    side = "limited" if cls == "LimitedFlow" else "unlimited"
                    result[f"{side}_{round_}"] = _burst(stack, cls, count, args.keys, args.timeout)
            stack.stop_worker()
            result["deferral"] = _deferral_cost(100)
        finally:
            stack.close()
    print(result, file=sys.stderr)
    write_result(args.name or f"limits_fleet_{args.backend}", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
