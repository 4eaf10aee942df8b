"""B2/B3/B5/B6: our engine through a real Celery worker (prefork -c 2) on Redis.

The bench process creates workflows (each create commits, and the after-commit hook publishes
``geneva_drive.perform_step``); a ``celery -A geneva_drive.celery worker`` runs the steps against the
same database. Step bodies log their wall-clock start/end (bench/flows.py), so:

* hop = start of step k+1 - end of step k (what the engine adds between two steps:
  finalize, commit, publish, Redis, the worker picking the message up, prepare);
* throughput = steps / (first create → last step end) for a burst of workflows;
* B5: signal delivered (commit called) → woken step body start, sequential and 200 at once;
* B6: delayed steps found due by the dispatcher, with worker restarts (RSS, duplicates, lag).

    .venv/bin/python -m bench.engine_celery --backend sqlite|postgres|mariadb [--quick] [--scenarios hops,signals,delayed,chains,fresh] [--inline on|off]

Redis database 14 of 127.0.0.1:6379 (flushed by us only); PostgreSQL in schema
``geneva_bench`` (dropped afterwards); MariaDB in database ``geneva_bench`` next to
GENEVA_BENCH_MARIADB_URL's (dropped afterwards); SQLite in a temporary file. Workers are stopped by PID.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    POLL,
    PY,
    REDIS_URL,
    ROOT,
    Deadline,
    child_env,
    children_of,
    drop_mariadb_database,
    drop_pg_schema,
    env_info,
    pg_schema_url,
    reset_mariadb_database,
    reset_pg_schema,
    rss_kb,
    stop_process,
    summarize_ms,
    write_result,
)

QUEUE = "bench"
#: GENEVA_BENCH_SCHEMA: another schema, when another bench run shares the database.
SCHEMA = os.environ.get("GENEVA_BENCH_SCHEMA", "geneva_bench")


class Timings:
    """Tails the per-process timing files written by bench/flows.py."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.offsets: dict[str, int] = {}
        # (class, workflow id, step index) -> list of (start, end, pid)
        self.rows: dict[tuple[str, int, int], list[tuple[float, float, int]]] = {}
        self.count = 0

    def poll(self) -> int:
        for path in glob.glob(os.path.join(self.dir, "*.log")):
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            cut = data.rfind(b"\n") + 1
            if not cut:
                continue
            for line in data[:cut].decode().splitlines():
                cls, wf, idx, start, end, pid = line.split()
                self.rows.setdefault((cls, int(wf), int(idx)), []).append(
                    (float(start), float(end), int(pid))
                )
                self.count += 1
            self.offsets[path] = offset + cut
        return self.count

    def wait_for(
        self, keys: list[tuple[str, int, int]], timeout: float, sleep: float = POLL
    ) -> bool:
        deadline = Deadline(timeout)
        while not deadline.expired():
            self.poll()
            if all(k in self.rows for k in keys):
                return True
            time.sleep(sleep)
        return False

    def wait_count(self, n: int, timeout: float, sleep: float = 0.005) -> bool:
        deadline = Deadline(timeout)
        while not deadline.expired():
            if self.poll() >= n:
                return True
            time.sleep(sleep)
        return False


class Stack:
    """Database + Redis + one Celery worker for the engine."""

    def __init__(
        self, backend: str, workdir: str, schema: str = SCHEMA, redis_url: str = REDIS_URL
    ) -> None:
        """``redis_url``: the broker (default the shared server's bench database; B12 passes a
        private ``redis-server``, bench/cost.py's ``_private_redis``). Flushed here."""
        self.backend = backend
        self.schema = schema
        self.workdir = workdir
        self.timings_dir = os.path.join(workdir, "timings")
        os.makedirs(self.timings_dir, exist_ok=True)
        if backend == "sqlite":
            self.url = f"sqlite:///{workdir}/engine.sqlite3"
        elif backend == "mariadb":
            self.url = reset_mariadb_database(schema)
        else:
            reset_pg_schema(schema)
            self.url = pg_schema_url(schema)
        os.environ["GENEVA_BROKER_URL"] = redis_url
        os.environ["GENEVA_DEFAULT_QUEUE"] = QUEUE
        os.environ["GENEVA_DATABASE_URL"] = self.url
        os.environ["GENEVA_BENCH_TIMINGS"] = self.timings_dir
        import redis

        redis.Redis.from_url(redis_url).flushdb()
        from geneva_drive import db
        from geneva_drive.models import Base

        self.engine = db.configure(self.url)
        Base.metadata.create_all(self.engine)
        from geneva_drive.transport import set_transport

        set_transport(None)  # the default: Celery, after commit
        import bench.flows  # noqa: F401  (registers the workflow classes here too)

        self.timings = Timings(self.timings_dir)
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log = os.path.join(workdir, "worker.log")

    def start_worker(self, concurrency: int = 2) -> None:
        env = child_env(GENEVA_WORKFLOW_MODULES="bench.flows")
        cmd = [
            PY, "-m", "celery", "-A", "geneva_drive.celery", "worker", "-P", "prefork",
            "-c", str(concurrency), "-l", "WARNING", "-Q", QUEUE,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        log = open(self.worker_log, "a")  # noqa: SIM115 (kept open for the worker's life)
        self.worker = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop_process(self.worker)
            self.worker = None

    def worker_rss_kb(self) -> dict[str, int | None]:
        if self.worker is None:
            return {}
        main = rss_kb(self.worker.pid)
        kids = [rss_kb(c) or 0 for c in children_of(self.worker.pid)]
        return {"main_kb": main, "children_kb": sum(kids), "total_kb": (main or 0) + sum(kids)}

    def create(self, cls_name: str, n: int = 1, per_commit: int = 1) -> list[tuple[int, float]]:
        """Create ``n`` workflows, ``per_commit`` per transaction; [(id, time before commit)]."""
        from bench import flows
        from geneva_drive import db

        cls = getattr(flows, cls_name)
        out: list[tuple[int, float]] = []
        while len(out) < n:
            with db.new_session() as session:
                ids = []
                for _ in range(min(per_commit, n - len(out))):
                    wf = cls.create(session=session, allow_multiple=True)
                    session.flush()
                    ids.append(wf.id)
                t = time.time()
                session.commit()
            out.extend((wf_id, t) for wf_id in ids)
        return out

    def warm_up(self) -> bool:
        created = self.create("HopFlow", 10)
        keys = [("HopFlow", wf, 2) for wf, _ in created]
        return self.timings.wait_for(keys, 90, sleep=0.01)

    def close(self) -> None:
        self.stop_worker()
        from geneva_drive import db

        db.get_engine().dispose()
        if self.backend == "postgres":
            drop_pg_schema(self.schema)
        elif self.backend == "mariadb":
            drop_mariadb_database(self.schema)


def hops_of(timings: Timings, cls: str, ids: list[int], steps: int) -> list[float]:
    hops = []
    for wf in ids:
        for k in range(1, steps):
            a = timings.rows.get((cls, wf, k - 1))
            b = timings.rows.get((cls, wf, k))
            if a and b:
                hops.append(b[0][0] - a[0][1])
    return hops


def scenario_hops(stack: Stack, quick: bool) -> dict[str, Any]:
    """Unloaded hops (sequential workflows), then a burst for throughput."""
    t = stack.timings
    n_seq = 20 if quick else 50
    first_start: list[float] = []
    seq_ids = []
    deadline = Deadline(120)
    for _ in range(n_seq):
        if deadline.expired():
            break
        [(wf, t_commit)] = stack.create("HopFlow")
        if not t.wait_for([("HopFlow", wf, 2)], 30, sleep=POLL):
            break
        seq_ids.append(wf)
        first_start.append(t.rows[("HopFlow", wf, 0)][0][0] - t_commit)
    unloaded = summarize_ms(hops_of(t, "HopFlow", seq_ids, 3))
    e2e = [t.rows[("HopFlow", wf, 2)][0][1] - t.rows[("HopFlow", wf, 0)][0][0] for wf in seq_ids]

    n_burst = 100 if quick else 500
    t0 = time.time()
    created = stack.create("HopFlow", n_burst)
    t_created = time.time() - t0
    ids = [wf for wf, _ in created]
    ok = t.wait_for([("HopFlow", wf, 2) for wf in ids], 240, sleep=0.01)
    done = [wf for wf in ids if ("HopFlow", wf, 2) in t.rows]
    ends = [
        t.rows[("HopFlow", wf, k)][0][1]
        for wf in ids
        for k in range(3)
        if ("HopFlow", wf, k) in t.rows
    ]
    wall = (max(ends) - t0) if ends else float("nan")
    steps = len(ends)
    if wall == wall and wall > 0:
        stack.__dict__["steps_per_s"] = steps / wall
    return {
        "unloaded_hop": unloaded,
        "unloaded_create_commit_to_first_step": summarize_ms(first_start),
        "unloaded_workflow_first_start_to_last_end": summarize_ms(e2e),
        "burst": {
            "workflows": n_burst,
            "completed": len(done),
            "all_completed": ok,
            "create_s": round(t_created, 3),
            "creates_per_s": round(n_burst / t_created, 1),
            "wall_s": round(wall, 3),
            "steps_per_s": round(steps / wall, 1) if wall == wall else None,
            "hop_under_load": summarize_ms(hops_of(t, "HopFlow", ids, 3)),
        },
    }


def scenario_chains(stack: Stack, quick: bool) -> dict[str, Any]:
    """B3's throughput on 10-step workflows: a burst of ChainFlow, steps/s to the last end."""
    t = stack.timings
    n = 50 if quick else 150
    t0 = time.time()
    ids = [wf for wf, _ in stack.create("ChainFlow", n, per_commit=n)]
    ok = t.wait_for([("ChainFlow", wf, 9) for wf in ids], 240, sleep=0.01)
    ends = [
        t.rows[("ChainFlow", wf, k)][0][1]
        for wf in ids
        for k in range(10)
        if ("ChainFlow", wf, k) in t.rows
    ]
    wall = (max(ends) - t0) if ends else float("nan")
    return {
        "workflows": n,
        "all_completed": ok,
        "steps": len(ends),
        "wall_s": round(wall, 3),
        "steps_per_s": round(len(ends) / wall, 1) if ends else None,
        "hop_under_load": summarize_ms(hops_of(t, "ChainFlow", ids, 10)),
    }


def scenario_fresh(stack: Stack, quick: bool) -> dict[str, Any]:
    """Fairness: create -> first step start of a new one-step workflow, every 50 ms, while 50
    ten-step workflows run (each finished chain is replaced at once)."""
    t = stack.timings
    seconds = 4.0 if quick else 8.0
    inflight = {wf for wf, _ in stack.create("ChainFlow", 50, per_commit=50)}
    fresh: list[tuple[int, float]] = []
    chains_done = 0
    t_end = time.time() + seconds
    while time.time() < t_end:
        fresh.extend(stack.create("FreshFlow"))
        time.sleep(0.05)
        t.poll()
        finished = {wf for wf in inflight if ("ChainFlow", wf, 9) in t.rows}
        if finished:
            chains_done += len(finished)
            inflight -= finished
            created = stack.create("ChainFlow", len(finished), per_commit=len(finished))
            inflight |= {wf for wf, _ in created}
    t.wait_for([("FreshFlow", wf, 0) for wf, _ in fresh], 60, sleep=0.01)
    delays = [
        t.rows[("FreshFlow", wf, 0)][0][0] - t_commit
        for wf, t_commit in fresh
        if ("FreshFlow", wf, 0) in t.rows
    ]
    drained = t.wait_for([("ChainFlow", wf, 9) for wf in inflight], 120, sleep=0.01)
    return {
        "fresh_workflows": len(fresh),
        "fresh_started": len(delays),
        "create_to_first_step": summarize_ms(delays),
        "chains_completed_meanwhile": chains_done,
        "chains_drained": drained,
    }


def _park(stack: Stack, n: int) -> list[int]:
    """Create ``n`` SignalFlow workflows and wait until their second step is parked."""
    from sqlalchemy import func, select

    from geneva_drive import db
    from geneva_drive.models import StepExecution

    ids = [wf for wf, _ in stack.create("SignalFlow", n)]
    deadline = Deadline(120)
    while not deadline.expired():
        with db.new_session() as session:
            waiting = session.scalar(
                select(func.count())
                .select_from(StepExecution)
                .where(StepExecution.workflow_id.in_(ids), StepExecution.state == "waiting")
            )
        if waiting == n:
            break
        time.sleep(0.05)
    return ids


def _signal(wf_id: int) -> tuple[float, float]:
    """Deliver ``go`` to one workflow; wall time just before the commit and once it returned.

    The commit includes the signal row's own durable write (an fsync on PostgreSQL) and the
    after-commit publish of the woken step; "committed" is when a webhook could answer 200.
    """
    from geneva_drive import db
    from geneva_drive.workflow import Workflow

    with db.new_session() as session:
        wf = session.get(Workflow, wf_id)
        assert wf is not None
        wf.signal("go")
        session.flush()
        t = time.time()
        session.commit()
        done = time.time()
    return t, done


def scenario_signals(stack: Stack, quick: bool) -> dict[str, Any]:
    t = stack.timings
    n = 50 if quick else 200
    ids = _park(stack, n)
    sequential = []
    sequential_committed = []
    commit_ms = []
    for wf in ids:
        t_commit, t_committed = _signal(wf)
        if not t.wait_for([("SignalFlow", wf, 1)], 30, sleep=POLL):
            break
        started = t.rows[("SignalFlow", wf, 1)][0][0]
        sequential.append(started - t_commit)
        sequential_committed.append(started - t_committed)
        commit_ms.append(t_committed - t_commit)
    ids = _park(stack, n)
    sent = {wf: _signal(wf)[0] for wf in ids}
    t.wait_for([("SignalFlow", wf, 1) for wf in ids], 120, sleep=0.005)
    concurrent = [
        t.rows[("SignalFlow", wf, 1)][0][0] - sent[wf]
        for wf in ids
        if ("SignalFlow", wf, 1) in t.rows
    ]
    return {
        "sequential": summarize_ms(sequential),
        "sequential_from_committed": summarize_ms(sequential_committed),
        "signal_commit": summarize_ms(commit_ms),
        "concurrent_waiters": n,
        "concurrent": summarize_ms(concurrent),
    }


def scenario_delayed(stack: Stack, quick: bool) -> dict[str, Any]:
    """B6: N steps 1 min to 7 days ahead; RSS; then time-travel them due with worker restarts."""
    import threading

    from sqlalchemy import bindparam, func, select, update

    from geneva_drive import db
    from geneva_drive.config import settings
    from geneva_drive.models import StepExecution, UTCDateTime, utcnow
    from geneva_drive.workflow import Workflow

    table = StepExecution.__table__
    _MOVE = (
        update(table)  # type: ignore[arg-type]
        .where(table.c.id == bindparam("b_id"))  # type: ignore[attr-defined]
        .values(scheduled_for=bindparam("b_at", type_=UTCDateTime()))
    )

    n = 2000 if quick else 10_000
    due_n = 300 if quick else 600  # brought due by the time travel; the rest stay parked
    period = 1.0
    settings.dispatch_interval = timedelta(seconds=period)
    rss_before = stack.worker_rss_kb()
    t0 = time.time()
    ids = [wf for wf, _ in stack.create("DelayedFlow", n, per_commit=250)]
    create_s = time.time() - t0
    rng = random.Random(8)
    now = utcnow()
    # A tenth more held by a wait_until job option instead: no message at creation,
    # none from the dispatcher while it lies beyond the horizon.
    held_ids = _create_wait_until(n // 10, rng)
    with db.transaction() as session:
        rows = (
            session.execute(select(StepExecution.id).where(StepExecution.workflow_id.in_(ids)))
            .scalars()
            .all()
        )
        # spread 1 min .. 7 days ahead
        params = [
            {"b_id": ex_id, "b_at": now + timedelta(seconds=rng.uniform(60, 7 * 86400))}
            for ex_id in rows
        ]
        session.connection().execute(_MOVE, params)
    with db.new_session() as session:
        unsent = session.scalar(
            select(StepExecution.id)
            .where(StepExecution.workflow_id.in_(ids), StepExecution.sent_at.is_not(None))
            .limit(1)
        )
    ids = ids + held_ids
    held_lookup = set(held_ids)

    def flow_of(wf_id: int) -> str:
        return "WaitUntilFlow" if wf_id in held_lookup else "DelayedFlow"

    # A dispatcher runs meanwhile (nothing is due): the broker and the worker hold nothing.
    stop = threading.Event()
    dispatcher = threading.Thread(target=_dispatch_loop, args=(stop, period), daemon=True)
    dispatcher.start()
    time.sleep(5 if quick else 10)
    rss_parked = stack.worker_rss_kb()
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    queued_in_redis = r.llen(QUEUE)
    # kombu's Redis transport keeps delivered, unacknowledged messages (a countdown the worker
    # holds) in the "unacked" hash: a long countdown would show up there.
    unacked_in_redis = r.hlen("unacked")
    with db.new_session() as session:
        held_sent = session.scalar(
            select(func.count()).where(
                StepExecution.workflow_id.in_(held_ids), StepExecution.sent_at.is_not(None)
            )
        )
    # Time travel: the ``due_n`` soonest, rank order kept, all due within a window the worker
    # keeps up with (about a third of its measured burst rate), so lag is dispatch, not queueing.
    rate = float(stack.__dict__.get("steps_per_s") or 30.0)
    window = max(20.0, due_n / max(5.0, rate / 3))
    start_at = utcnow() + timedelta(seconds=3)
    with db.transaction() as session:
        ordered = session.execute(
            select(StepExecution.workflow_id, StepExecution.id)
            .where(StepExecution.workflow_id.in_(ids))
            .order_by(StepExecution.scheduled_for)
            .limit(due_n)
        ).all()
        params = [
            {"b_id": ex_id, "b_at": start_at + timedelta(seconds=window * rank / due_n)}
            for rank, (_wf, ex_id) in enumerate(ordered)
        ]
        session.connection().execute(_MOVE, params)
        # The wait_until rows travel with their job option (else it would hold them again).
        held_set = set(held_ids)
        for (wf_id, _ex), moved in zip(ordered, params, strict=True):
            if wf_id in held_set:
                workflow = session.get(Workflow, wf_id)
                assert workflow is not None
                workflow.step_job_options = {"wait_until": moved["b_at"]}
    due_ids = [wf for wf, _ex in ordered]
    restarts = 0
    deadline = Deadline(window + 120)
    restart_at = [window * 0.33, window * 0.66]
    t_start = time.time()
    while not deadline.expired():
        stack.timings.poll()
        done = sum(1 for wf in due_ids if (flow_of(wf), wf, 0) in stack.timings.rows)
        if done >= due_n:
            break
        if restart_at and time.time() - t_start > 3 + restart_at[0]:
            restart_at.pop(0)
            stack.stop_worker()
            stack.start_worker()
            restarts += 1
        time.sleep(0.2)
    stop.set()
    dispatcher.join(10)
    rss_after = stack.worker_rss_kb()
    t = stack.timings
    runs = {wf: len(t.rows.get((flow_of(wf), wf, 0), [])) for wf in ids}
    with db.new_session() as session:
        rows2 = session.execute(
            select(
                StepExecution.workflow_id, StepExecution.scheduled_for, StepExecution.sent_at
            ).where(StepExecution.workflow_id.in_(ids))
        ).all()
    sched = {wf: s.timestamp() for wf, s, _ in rows2}
    due_set = set(due_ids)
    dispatch_lag = [
        sent.timestamp() - s.timestamp()
        for wf, s, sent in rows2
        if sent is not None and wf in due_set
    ]
    start_lag = [t.rows[(flow_of(wf), wf, 0)][0][0] - sched[wf] for wf in due_ids if runs[wf]]
    early = sum(
        1 for wf in ids if runs[wf] and t.rows[(flow_of(wf), wf, 0)][0][0] < sched[wf] - 0.001
    )
    return {
        "steps": n + len(held_ids),
        "wait_until_steps": len(held_ids),
        "wait_until_sent_while_parked": held_sent,
        "wait_until_brought_due": sum(1 for wf in due_ids if wf in held_set),
        "create_s": round(create_s, 2),
        "sent_at_commit_before_due": unsent is not None,
        "redis_queue_len_while_parked": queued_in_redis,
        "redis_unacked_while_parked": unacked_in_redis,
        "dispatch_period_s": period,
        "worker_rss_kb_before_create": rss_before,
        "worker_rss_kb_while_parked": rss_parked,
        "worker_rss_kb_after_run": rss_after,
        "worker_main_rss_growth_parked_kb": (rss_parked.get("main_kb") or 0)
        - (rss_before.get("main_kb") or 0),
        "time_travel_window_s": round(window, 1),
        "worker_restarts": restarts,
        "brought_due": due_n,
        "ran": sum(1 for v in runs.values() if v),
        "ran_early": early,
        "duplicates": sum(v - 1 for v in runs.values() if v > 1),
        "due_never_ran": sum(1 for wf in due_ids if runs[wf] == 0),
        "not_due_ran": sum(1 for wf in ids if runs[wf] and wf not in due_set),
        "dispatch_lag_sent_minus_due": summarize_ms(dispatch_lag),
        "start_lag_body_start_minus_due": summarize_ms(start_lag),
    }


def _create_wait_until(count: int, rng: random.Random) -> list[int]:
    """WaitUntilFlow workflows, each held 1 min to 7 days ahead by its own wait_until."""
    from bench import flows
    from geneva_drive import db
    from geneva_drive.models import utcnow

    out: list[int] = []
    while len(out) < count:
        with db.transaction() as session:
            for _ in range(min(250, count - len(out))):
                ahead = timedelta(seconds=rng.uniform(60, 7 * 86400))
                wf = flows.WaitUntilFlow.create(
                    session=session,
                    allow_multiple=True,
                    step_job_options={"wait_until": (utcnow() + ahead).timestamp()},
                )
                session.flush()
                out.append(wf.id)
    return out


def _dispatch_loop(stop: Any, period: float) -> None:
    """The engine's own dispatcher loop (``geneva-drive dispatcher``), without housekeeping."""
    from geneva_drive.dispatch import run_dispatcher

    run_dispatcher(stop, interval=period, housekeeping=False)


def scenario_trace(stack: Stack, quick: bool) -> dict[str, Any]:
    """Where a hop goes (bench/hop_trace.py; the worker runs with GENEVA_BENCH_TRACE=1)."""
    from sqlalchemy import select

    from bench import hop_trace
    from geneva_drive import db
    from geneva_drive.models import StepExecution

    t = stack.timings
    hops: list[tuple[int, int, float, float]] = []
    for _ in range(15 if quick else 40):
        [(wf, _t)] = stack.create("HopFlow")
        if not t.wait_for([("HopFlow", wf, 2)], 30):
            break
        with db.new_session() as session:
            ids = session.scalars(
                select(StepExecution.id)
                .where(StepExecution.workflow_id == wf)
                .order_by(StepExecution.id)
            ).all()
        for k in (1, 2):
            end = t.rows[("HopFlow", wf, k - 1)][0][1]
            start = t.rows[("HopFlow", wf, k)][0][0]
            hops.append((ids[k - 1], ids[k], end, start))
    time.sleep(0.2)  # the last trace lines are written after the body
    return {"segments": hop_trace.segments(stack.timings_dir, hops)}


SCENARIOS = {
    "hops": scenario_hops,
    "signals": scenario_signals,
    "chains": scenario_chains,
    "fresh": scenario_fresh,
    "delayed": scenario_delayed,
    "trace": scenario_trace,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["sqlite", "postgres", "mariadb"], required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--scenarios", default="hops,signals,delayed")
    parser.add_argument(
        "--name", default=None, help="result name (default engine_celery_<backend>)"
    )
    parser.add_argument(
        "--inline",
        choices=["on", "off"],
        default="on",
        help="GENEVA_INLINE_SUCCESSORS for the worker (default on, the engine's default)",
    )
    args = parser.parse_args()
    os.environ["GENEVA_INLINE_SUCCESSORS"] = "true" if args.inline == "on" else "false"
    result: dict[str, Any] = {
        "backend": args.backend,
        "env": env_info(),
        "quick": args.quick,
        "inline_successors": args.inline,
    }
    with tempfile.TemporaryDirectory(prefix="geneva-bench-") as workdir:
        stack = Stack(args.backend, workdir)
        if "trace" in args.scenarios.split(","):
            os.environ["GENEVA_BENCH_TRACE"] = "1"  # the worker inherits it (bench/hop_trace.py)
        try:
            stack.start_worker()
            result["warm"] = stack.warm_up()
            result["worker_rss_kb_after_warmup"] = stack.worker_rss_kb()
            for name in args.scenarios.split(","):
                t0 = time.time()
                try:
                    result[name] = SCENARIOS[name](stack, args.quick)
                except Exception as error:  # record and go on with the next scenario
                    result[name] = {"error": f"{type(error).__name__}: {error}"}
                result[name]["elapsed_s"] = round(time.time() - t0, 1)
                print(f"[engine {args.backend}] {name}: {result[name]}", file=sys.stderr)
        finally:
            stack.close()
            try:
                result["worker_log_tail"] = Path(stack.worker_log).read_text()[-2000:]
            except OSError:
                pass
    write_result(args.name or f"engine_celery_{args.backend}", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
