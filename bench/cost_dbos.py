"""DBOS's side of bench/cost.py: CPU seconds per step of DBOS's whole deployment.

DBOS runs every step in this one process and checkpoints in PostgreSQL, so its deployment is
this process plus the PostgreSQL backends of its system database (``geneva_cost_dbos``,
created and dropped here, so that no other user of the shared server is counted). Two modes,
each over ``--n`` ten-step workflows of no-op steps (B3's workload):

* ``seq``: the workflows called one after the other in process (DBOS's best mode in the
  paired rounds);
* ``queue``: all enqueued at once on a DBOS queue (polling 50 ms, as bench/peer_dbos.py), run
  by DBOS's own executor threads: the nearest thing to a worker fleet.

Runs under the peers' venv (bench/.venv-peers, made by bench/run.py), not the project's:

    bench/.venv-peers/bin/python -m bench.cost_dbos --n 100 --json /tmp/x.json
"""

import argparse
import json
import os
import sys
import time

from bench.common import PgBackends, cpu_seconds, env_info

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=100)
ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
ap.add_argument("--db-name", default=os.environ.get("GENEVA_COST_DBOS_DB", "geneva_cost_dbos"))
ap.add_argument("--json", required=True)
args = ap.parse_args()

import sqlalchemy as sa  # noqa: E402

assert "127.0.0.1" in args.pg_url, "loopback only"
admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
with admin.connect() as conn:
    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)'))
sys_url = args.pg_url.rsplit("/", 1)[0] + "/" + args.db_name

from dbos import DBOS  # noqa: E402

DBOS(config={"name": "genevacost", "system_database_url": sys_url, "log_level": "WARNING"})


@DBOS.step()
def noop_step(x):
    return x


@DBOS.workflow()
def wf10(x):
    for _ in range(10):
        x = noop_step(x)
    return x


DBOS.launch()
queue = DBOS.register_queue("geneva_cost_q", polling_interval_sec=0.05)
backends = PgBackends(args.db_name, args.pg_url.replace("postgresql+psycopg", "postgresql"))
me = os.getpid()


def measure(label, run):
    """CPU of this process (all its threads) and of its database's backends around ``run``."""
    load0 = os.getloadavg()[0]
    backends.start()
    cpu0 = cpu_seconds(me) or 0.0
    t0 = time.perf_counter()
    steps = run()
    wall = time.perf_counter() - t0
    cpu1 = cpu_seconds(me) or 0.0
    backends.sample()
    parts = {"dbos_process": cpu1 - cpu0, "postgres": backends.seconds()}
    out = {
        "steps": steps,
        "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall, 1),
        "cpu_s": {k: round(v, 3) for k, v in parts.items()},
        "cpu_ms_per_step": {k: round(v * 1000 / steps, 4) for k, v in parts.items()},
        "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    out["cpu_ms_per_step"]["total"] = round(sum(parts.values()) * 1000 / steps, 4)
    idle = result.get("idle_cpu_ms_per_s", {})
    net = sum(parts.values()) * 1000 - sum(idle.values()) * wall
    out["cpu_ms_per_step_above_idle"] = round(net / steps, 4)
    print(f"[cost dbos] {label}: {out}", file=sys.stderr)
    return out


def run_seq():
    last = time.monotonic()
    for i in range(args.n):
        wf10(1_000_000 + i)
        if time.monotonic() - last > 0.5:  # catch backends that come and go meanwhile
            backends.sample()
            last = time.monotonic()
    return 10 * args.n


def run_queue():
    handles = [queue.enqueue(wf10, 2_000_000 + i) for i in range(args.n)]
    last = time.monotonic()
    for h in handles:
        h.get_result(polling_interval_sec=0.05)
        if time.monotonic() - last > 0.5:
            backends.sample()
            last = time.monotonic()
    return 10 * len(handles)


for i in range(20):  # warm-up: connections, caches
    wf10(10_000_000 + i)
result = {"side": "dbos", "n": args.n, "env": env_info()}
try:
    from importlib.metadata import version

    result["dbos_version"] = version("dbos")
except Exception:
    pass
# Idle: what this process (DBOS's queue poller and other threads) and its backends burn per
# second with nothing to run; bench/cost.py measures the same for our deployment.
backends.start()
idle0 = cpu_seconds(me) or 0.0
time.sleep(3.0)
backends.sample()
result["idle_cpu_ms_per_s"] = {
    "dbos_process": round(((cpu_seconds(me) or 0.0) - idle0) * 1000 / 3.0, 3),
    "postgres": round(backends.seconds() * 1000 / 3.0, 3),
}
result["seq"] = measure("seq", run_seq)
result["queue"] = measure("queue", run_queue)
backends.close()
DBOS.destroy()
with admin.connect() as conn:
    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)'))
admin.dispose()
with open(args.json, "w") as f:
    json.dump(result, f, indent=2, sort_keys=True)
