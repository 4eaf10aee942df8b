"""B7: housekeeping over 1,000,000 step executions on PostgreSQL, hop latency meanwhile.

Seeds schema ``geneva_bench_hk`` (dropped afterwards) with INSERT … SELECT generate_series:
finished workflows transitioned 60 days ago with 3 completed executions each (1M executions
in full mode), plus ongoing workflows that must survive. Then, with a Celery worker running
the engine on the same schema:

1. baseline hop latency (sequential 3-step workflows);
2. ``geneva_drive.housekeeping.cleanup`` (the production code path, default batch size) in a
   thread, timing every batch transaction (begin → commit on its connection), while the
   same hop probe runs;
3. rows/s, batch p50/max, hop p99 during vs before.

    .venv/bin/python -m bench.engine_housekeeping [--executions 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from typing import Any

from sqlalchemy import event, text

from bench.common import Deadline, env_info, summarize_ms, write_result
from bench.engine_celery import Stack, hops_of

SCHEMA = "geneva_bench_hk"


def seed(engine: Any, finished: int, ongoing: int) -> float:
    t0 = time.time()
    with engine.begin() as c:
        c.execute(
            text(f"""
            INSERT INTO geneva_drive_workflows
                (type, state, allow_multiple, created_at, updated_at, transitioned_at)
            SELECT 'HopFlow', 'finished', true, now() - interval '61 days',
                   now() - interval '60 days', now() - interval '60 days'
            FROM generate_series(1, {finished})""")
        )
        c.execute(
            text(f"""
            INSERT INTO geneva_drive_workflows
                (type, state, allow_multiple, created_at, updated_at)
            SELECT 'HopFlow', 'ready', true, now(), now() FROM generate_series(1, {ongoing})""")
        )
        c.execute(
            text("""
            INSERT INTO geneva_drive_step_executions
                (workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
                 finished_at, created_at, updated_at)
            SELECT w.id, s.name, 'completed', 'success', w.created_at, w.created_at,
                   w.created_at, w.created_at, w.created_at, w.created_at
            FROM geneva_drive_workflows w,
                 (VALUES ('one'), ('two'), ('three')) AS s(name)
            WHERE w.state = 'finished'""")
        )
        c.execute(
            text("""
            INSERT INTO geneva_drive_step_executions
                (workflow_id, step_name, state, scheduled_for, created_at, updated_at)
            SELECT w.id, 'one', 'scheduled', now() + interval '30 days', now(), now()
            FROM geneva_drive_workflows w WHERE w.state = 'ready'""")
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE geneva_drive_workflows"))
        c.execute(text("VACUUM ANALYZE geneva_drive_step_executions"))
    return time.time() - t0


def hop_probe(stack: Stack, stop: threading.Event, ids: list[int], limit_s: float) -> None:
    deadline = Deadline(limit_s)
    while not stop.is_set() and not deadline.expired():
        [(wf, _)] = stack.create("HopFlow")
        if stack.timings.wait_for([("HopFlow", wf, 2)], 30, sleep=0.001):
            ids.append(wf)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    executions = 150_000 if args.quick else args.executions
    finished = executions // 3
    ongoing = max(1000, finished // 10)
    res: dict[str, Any] = {"env": env_info(), "executions_to_delete": finished * 3,
                           "workflows_to_delete": finished, "ongoing_workflows": ongoing}  # fmt: skip
    from datetime import timedelta

    from geneva_drive.config import settings

    with tempfile.TemporaryDirectory(prefix="geneva-b7-") as workdir:
        stack = Stack("postgres", workdir, schema=SCHEMA)
        try:
            res["seed_s"] = round(seed(stack.engine, finished, ongoing), 1)
            print(f"[b7] seeded in {res['seed_s']} s", file=sys.stderr)
            stack.start_worker()
            stack.warm_up()
            baseline: list[int] = []
            hop_probe(stack, threading.Event(), baseline, 30)  # bounded by time
            baseline = baseline[:40]
            res["hop_before"] = summarize_ms(hops_of(stack.timings, "HopFlow", baseline, 3))

            batches: list[float] = []
            started: dict[int, float] = {}
            hk_thread: dict[str, Any] = {}

            @event.listens_for(stack.engine, "begin")
            def _begin(conn: Any) -> None:
                if threading.get_ident() == hk_thread.get("ident"):
                    started[id(conn)] = time.perf_counter()

            @event.listens_for(stack.engine, "commit")
            def _commit(conn: Any) -> None:
                t = started.pop(id(conn), None)
                if t is not None:
                    batches.append(time.perf_counter() - t)

            settings.delete_completed_workflows_after = timedelta(days=30)
            from geneva_drive.housekeeping import HousekeepingReport, cleanup
            from geneva_drive.models import utcnow

            report = HousekeepingReport()
            timing: dict[str, float] = {}

            def run_cleanup() -> None:
                hk_thread["ident"] = threading.get_ident()
                t0 = time.perf_counter()
                try:
                    cleanup(utcnow(), report)
                except Exception as error:
                    timing["error"] = f"{type(error).__name__}: {error}"  # type: ignore[assignment]
                timing["elapsed"] = time.perf_counter() - t0

            stop = threading.Event()
            during: list[int] = []
            probe = threading.Thread(target=hop_probe, args=(stack, stop, during, 600))
            hk = threading.Thread(target=run_cleanup)
            hk.start()
            probe.start()
            hk.join(900)
            stop.set()
            probe.join(60)
            elapsed = timing.get("elapsed", float("nan"))
            deleted = report.step_executions_cleaned_up + report.workflows_cleaned_up
            with stack.engine.connect() as c:
                left = c.execute(text("SELECT count(*) FROM geneva_drive_step_executions")).scalar()
                left_wf = c.execute(
                    text("SELECT count(*) FROM geneva_drive_workflows WHERE state <> 'finished'")
                ).scalar()
            res.update({
                "report": report.as_dict(),
                "error": timing.get("error"),
                "elapsed_s": round(elapsed, 2),
                "rows_deleted": deleted,
                "rows_per_s": round(deleted / elapsed, 1),
                "step_executions_per_s": round(report.step_executions_cleaned_up / elapsed, 1),
                "batch_size": settings.housekeeping_batch_size,
                "batch_transaction": summarize_ms(batches),
                "hop_during": summarize_ms(hops_of(stack.timings, "HopFlow", during, 3)),
                "executions_left": left,
                "ongoing_left": left_wf,
            })  # fmt: skip
        finally:
            stack.close()
    print(f"[b7] {res}", file=sys.stderr)
    write_result("b7_housekeeping", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
