# ruff: noqa: RUF002  (docstrings use en dashes, as bench/report.py does)
"""CPU seconds per step of the whole deployment, ours beside DBOS and the raw floor.

Throughput on a shared machine moves with the neighbours' load; the CPU a step costs moves far
less, and it is what decides how a deployment holds up when the machine is busy. Each side runs
B3's workload (``--n`` ten-step workflows of no-op steps on PostgreSQL, created in one commit)
and reads utime+stime from /proc for every process of its deployment:

* **ours** (``--side ours``): the Celery worker (``prefork -c 2``, the engine's settings,
  inline successors on) with its children, the dispatcher (``geneva-drive dispatcher``, the
  documented production loop, default interval), a private ``redis-server`` started for the
  measurement (the shared one serves other users), the PostgreSQL backends of the run's own
  database ``geneva_cost_ours`` (pg_stat_activity by database, sampled during the run), and the
  client's CPU while it creates the workflows;
* **DBOS** (bench/cost_dbos.py, in the peers' venv): its one process and its database's
  backends, sequential and queued;
* **the raw floor** (``--side raw``): the two transactions of one engine hop issued bare
  through SQLAlchemy Core (bench/peer_raw_floor.py ``pg_hop_pairs``: the joined lock, the
  outcome, the successor's INSERT, the start; one synchronous and one asynchronous commit),
  this client process plus its backend.

Paired rounds alternate the order (odd rounds ours first, even rounds the peers first); the
verdict is the median of the rounds' ratios with their spread, and each round records the
1-minute load. ``--neighbour`` runs every round beside a fixed CPU-bound neighbour (one busy
process pinned to one core, bench/common.py ``start_neighbour``), stopped by its PID at the end.

    .venv/bin/python -m bench.cost --rounds 6 [--quick] [--neighbour]
    .venv/bin/python -m bench.cost --side ours|raw --json /tmp/x.json    # one measurement

Results: ``bench/results/run/cost.json`` (``cost_neighbour.json`` with ``--neighbour``), which
``python -m bench.run --render`` renders as the first section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH,
    OUT,
    PY,
    ROOT,
    PgBackends,
    apply_drop_indexes,
    child_env,
    cpu_seconds,
    env_info,
    start_neighbour,
    stop_neighbour,
    stop_process,
    tree_cpu,
)

PEERS_PY = BENCH / ".venv-peers" / "bin" / "python"
ADMIN_URL = os.environ.get(
    "GENEVA_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SIDES = ("ours", "dbos", "raw")


def start_fleet(
    workdir: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """B3's deployment: a prefork Celery worker (2 processes, queue ``bench``) and the
    ``geneva-drive dispatcher``, each in its own session, logging to ``workdir/procs.log``.
    Returns (the worker, the dispatcher); the caller stops them by their PIDs."""
    with open(os.path.join(workdir, "procs.log"), "a") as log:  # the children keep their copies
        return _spawn_fleet(log, env)


def _spawn_fleet(
    log: Any, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    worker = subprocess.Popen(
        [PY, "-m", "celery", "-A", "geneva_drive.celery", "worker", "-P", "prefork", "-c", "2",
         "-l", "WARNING", "-Q", "bench", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    dispatcher = subprocess.Popen(
        [str(Path(PY).parent / "geneva-drive"), "dispatcher"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return worker, dispatcher


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _database_url(name: str) -> str:
    """A fresh database ``name`` beside ADMIN_URL's (dropped first); its SQLAlchemy URL."""
    import psycopg

    assert "127.0.0.1" in ADMIN_URL or "localhost" in ADMIN_URL, "loopback only"
    with psycopg.connect(_libpq(ADMIN_URL), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(_libpq(ADMIN_URL), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _private_redis(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of our own on a free loopback port, without persistence: the shared
    server's CPU would include every other user's traffic."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def _figures(parts: dict[str, float], steps: int, wall: float, load0: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "steps": steps,
        "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall, 1) if wall > 0 else None,
        "cpu_s": {k: round(v, 3) for k, v in parts.items()},
        "cpu_ms_per_step": {k: round(v * 1000 / steps, 4) for k, v in parts.items()},
        "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    out["cpu_ms_per_step"]["total"] = round(sum(parts.values()) * 1000 / steps, 4)
    return out


def side_ours(n: int) -> dict[str, Any]:
    """B3 on PostgreSQL through the whole deployment; CPU of every process of it."""
    dbname = os.environ.get("GENEVA_COST_OURS_DB", "geneva_cost_ours")
    with tempfile.TemporaryDirectory(prefix="geneva-cost-") as workdir:
        url = _database_url(dbname)
        redis_proc, redis_url = _private_redis(workdir)
        timings_dir = os.path.join(workdir, "timings")
        os.makedirs(timings_dir)
        os.environ.update(
            GENEVA_BROKER_URL=redis_url,
            GENEVA_DEFAULT_QUEUE="bench",
            GENEVA_DATABASE_URL=url,
            GENEVA_BENCH_TIMINGS=timings_dir,
            GENEVA_WORKFLOW_MODULES="bench.flows",
        )
        from geneva_drive import db
        from geneva_drive.models import Base
        from geneva_drive.transport import set_transport

        engine = db.configure(url)
        Base.metadata.create_all(engine)
        dropped = apply_drop_indexes(engine)
        set_transport(None)  # Celery, after commit
        import bench.flows  # noqa: F401  (registers the workflow classes here too)
        from bench.engine_celery import Timings

        env = child_env()
        worker, dispatcher = start_fleet(workdir, env)
        backends = PgBackends(dbname, _libpq(ADMIN_URL))
        try:
            timings = Timings(timings_dir)
            warm = _create(10)
            if not timings.wait_for([("ChainFlow", wf, 9) for wf in warm], 120, sleep=0.05):
                raise RuntimeError("warm-up workflows did not finish (see the worker's log)")
            time.sleep(1.0)  # let the warm-up's tail settle before the baseline
            idle = _idle_rate(worker.pid, dispatcher.pid, redis_proc.pid, backends)
            load0 = os.getloadavg()[0]
            backends.start()
            procs0 = {"worker": tree_cpu(worker.pid), "dispatcher": tree_cpu(dispatcher.pid)}
            redis0 = cpu_seconds(redis_proc.pid, reaped=False) or 0.0
            t0 = time.time()
            client0 = time.process_time()
            ids = _create(n)
            client = time.process_time() - client0
            keys = [("ChainFlow", wf, 9) for wf in ids]
            deadline = time.monotonic() + 600
            while not all(k in timings.rows for k in keys):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n} workflows did not finish in 600 s")
                time.sleep(0.1)  # seldom: this process is not measured while it waits
                timings.poll()
                backends.sample()
            ends = [timings.rows[k][0][1] for k in keys]
            wall = max(ends) - t0
            procs1 = {"worker": tree_cpu(worker.pid), "dispatcher": tree_cpu(dispatcher.pid)}
            redis1 = cpu_seconds(redis_proc.pid, reaped=False) or 0.0
            backends.sample()
            parts = {
                name: sum(procs1[name].values()) - sum(procs0[name].values())
                for name in ("worker", "dispatcher")
            }
            parts["redis"] = redis1 - redis0
            parts["postgres"] = backends.seconds()
            parts["client_create"] = client
            out = _figures(parts, 10 * n, wall, load0)
            out["idle_cpu_ms_per_s"] = {k: round(v * 1000, 3) for k, v in idle.items()}
            # What the run cost above what the same processes burn idle for as long: the
            # deployment's cost per second of waiting (pollers, heartbeats) grows with the
            # wall time, which a loaded machine stretches.
            net = sum(parts.values()) - sum(idle.values()) * wall
            out["cpu_ms_per_step_above_idle"] = round(net * 1000 / (10 * n), 4)
            out["processes"] = {name: len(procs1[name]) for name in procs1}
            out["postgres_backends"] = len(backends.last)
            if dropped:
                out["dropped_indexes"] = dropped
        finally:
            backends.close()
            stop_process(worker)
            stop_process(dispatcher)
            stop_process(redis_proc)
            db.get_engine().dispose()
            _drop_database(dbname)
    return out


IDLE_S = 3.0


def _idle_rate(
    worker: int, dispatcher: int, redis_pid: int, backends: PgBackends
) -> dict[str, float]:
    """CPU seconds per second of each part while nothing runs (``IDLE_S`` seconds)."""

    def read() -> dict[str, float]:
        return {
            "worker": sum(tree_cpu(worker).values()),
            "dispatcher": sum(tree_cpu(dispatcher).values()),
            "redis": cpu_seconds(redis_pid, reaped=False) or 0.0,
        }

    backends.start()
    before = read()
    time.sleep(IDLE_S)
    after = read()
    backends.sample()
    rates = {k: (after[k] - before[k]) / IDLE_S for k in before}
    rates["postgres"] = backends.seconds() / IDLE_S
    return rates


def _create(n: int) -> list[int]:
    """``n`` ChainFlow workflows created in one commit (as B3's chains scenario)."""
    from bench.flows import ChainFlow
    from geneva_drive import db

    with db.new_session() as session:
        flows = [ChainFlow.create(session=session, allow_multiple=True) for _ in range(n)]
        session.flush()
        ids = [wf.id for wf in flows]
        session.commit()
    return ids


def side_raw(n: int) -> dict[str, Any]:
    """The two transactions of one engine hop, bare (Core), per step: client + backend."""
    from bench.peer_raw_floor import pg_hop_pairs, pg_setup
    from geneva_drive import db

    dbname = os.environ.get("GENEVA_COST_RAW_DB", "geneva_cost_raw")
    url = _database_url(dbname)
    engine = db.make_engine(url, pool_size=2)
    backends = PgBackends(dbname, _libpq(ADMIN_URL))
    try:
        pg_setup(engine, 1)
        pg_hop_pairs(engine, 1, 50, [])  # warm-up
        load0 = os.getloadavg()[0]
        backends.start()
        me0 = cpu_seconds(os.getpid()) or 0.0
        t0 = time.perf_counter()
        pg_hop_pairs(engine, 1, n, [])
        wall = time.perf_counter() - t0
        me = (cpu_seconds(os.getpid()) or 0.0) - me0
        backends.sample()
        out = _figures({"client": me, "postgres": backends.seconds()}, n, wall, load0)
    finally:
        backends.close()
        engine.dispose()
        _drop_database(dbname)
    return out


# --- paired rounds --------------------------------------------------------------------------


def _run_side(side: str, n: int, path: Path) -> dict[str, Any]:
    if side == "dbos":
        cmd = [str(PEERS_PY), "-m", "bench.cost_dbos", "--n", str(n), "--json", str(path)]
    else:
        cmd = [PY, "-m", "bench.cost", "--side", side, "--n", str(n * (10 if side == "raw" else 1)),
               "--json", str(path)]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-1500:]}
    data: dict[str, Any] = json.loads(path.read_text())
    data["elapsed_s"] = round(time.time() - t0, 1)
    return data


def round_order(k: int) -> list[str]:
    """Odd rounds ours first; even rounds the peers first."""
    return ["ours", "dbos", "raw"] if k % 2 == 1 else ["dbos", "raw", "ours"]


def ratios(rnd: dict[str, Any]) -> dict[str, float | None]:
    def total(path: list[str]) -> float | None:
        d: Any = rnd
        for key in path:
            d = d.get(key) if isinstance(d, dict) else None
        return d if isinstance(d, int | float) else None

    ours = total(["ours", "cpu_ms_per_step", "total"])
    out: dict[str, float | None] = {}
    modes = [total(["dbos", m, "cpu_ms_per_step", "total"]) for m in ("seq", "queue")]
    cheaper = min((m for m in modes if m), default=None)  # DBOS's cheaper mode this round
    out["ours_vs_dbos"] = round(ours / cheaper, 4) if ours and cheaper else None
    for key, path in (
        ("ours_vs_dbos_seq", ["dbos", "seq", "cpu_ms_per_step", "total"]),
        ("ours_vs_dbos_queue", ["dbos", "queue", "cpu_ms_per_step", "total"]),
        ("ours_vs_raw", ["raw", "cpu_ms_per_step", "total"]),
    ):
        peer = total(path)
        out[key] = round(ours / peer, 4) if ours and peer else None
    return out


def run_rounds(rounds: int, quick: bool, neighbour: bool) -> dict[str, Any]:
    n = 50 if quick else 100
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    meta: dict[str, Any] = {
        "command": ".venv/bin/python -m bench.cost " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "uptime_start": uptime,
        "workflows": n,
        "neighbour": neighbour,
        "env": env_info(),
    }
    result: dict[str, Any] = {"meta": meta, "rounds": {}}
    busy = start_neighbour() if neighbour else None
    meta["neighbour_cmd"] = busy.args if busy is not None else None
    try:
        with tempfile.TemporaryDirectory(prefix="geneva-cost-") as tmp:
            for k in range(1, rounds + 1):
                rnd: dict[str, Any] = {"order": round_order(k)}
                for side in rnd["order"]:
                    rnd[side] = _run_side(side, n, Path(tmp) / f"r{k}_{side}.json")
                    print(f"round {k} {side}: {_brief(rnd[side])}", file=sys.stderr, flush=True)
                rnd["ratios"] = ratios(rnd)
                result["rounds"][str(k)] = rnd
    finally:
        if busy is not None:
            stop_neighbour(busy)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    meta["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result["summary"] = summary(result)
    return result


def _brief(d: dict[str, Any]) -> str:
    if "error" in d:
        return f"{d['error']}: {d['stderr_tail'][-300:]}"
    if "seq" in d:
        return f"seq {d['seq']['cpu_ms_per_step']} / queue {d['queue']['cpu_ms_per_step']}"
    return f"{d.get('cpu_ms_per_step')} {d.get('steps_per_s')} steps/s"


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Median and spread (min–max) over the rounds of each ratio and each side's ms/step."""
    rounds = list(result["rounds"].values())
    out: dict[str, Any] = {}

    def spread(values: list[float]) -> dict[str, Any] | None:
        if not values:
            return None
        return {"median": round(statistics.median(values), 4), "min": min(values),
                "max": max(values), "n": len(values)}  # fmt: skip

    for key in ("ours_vs_dbos", "ours_vs_dbos_seq", "ours_vs_dbos_queue", "ours_vs_raw"):
        out[key] = spread([r["ratios"][key] for r in rounds if r["ratios"].get(key)])
    for label, path in (
        ("ours", ("ours",)),
        ("dbos_seq", ("dbos", "seq")),
        ("dbos_queue", ("dbos", "queue")),
        ("raw", ("raw",)),
    ):
        values = []
        for r in rounds:
            d: Any = r
            for key in path:
                d = d.get(key, {}) if isinstance(d, dict) else {}
            total = (d.get("cpu_ms_per_step") or {}).get("total")
            if isinstance(total, int | float):
                values.append(total)
        out[f"{label}_ms_per_step"] = spread(values)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--neighbour", action="store_true", help="a busy process on one core")
    parser.add_argument("--side", choices=["ours", "raw"], help="one measurement (a round's part)")
    parser.add_argument("--n", type=int, default=100, help="--side: workflows (raw: hops)")
    parser.add_argument("--json", help="--side: where to write its figures")
    parser.add_argument(
        "--label",
        help="rounds: write cost_<label>.json (not rendered into RESULTS.md; a run with a "
        "setting changed through the environment, cited from bench/NOTES.md)",
    )
    args = parser.parse_args()
    if args.side:
        out = side_ours(args.n) if args.side == "ours" else side_raw(args.n)
        out["env"] = env_info()
        print(f"[cost {args.side}] {out}", file=sys.stderr)
        Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if not PEERS_PY.exists():
        from bench.run import ensure_peers_venv

        reason = ensure_peers_venv()
        if reason:
            print(reason, file=sys.stderr)
            return 2
    result = run_rounds(args.rounds, args.quick, args.neighbour)
    name = "cost_neighbour" if args.neighbour else "cost"
    if args.label:
        name = f"cost_{args.label}"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
    if args.label:
        print(f"wrote {OUT / (name + '.json')}", file=sys.stderr)
        return 0
    from bench.report import render, write_readme_table

    (BENCH / "RESULTS.md").write_text(render())
    write_readme_table()
    print(f"wrote {OUT / (name + '.json')} and {BENCH / 'RESULTS.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
