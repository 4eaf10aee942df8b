"""Peer: DBOS Transact (Python), the same workload on the same database, same run (B4).

Adapted from the DBOS script of the original peer benchmark scripts (2026-11-29). Runs under the
peers' venv (bench/.venv-peers, made by bench/run.py: ``pip install dbos``), not the project's venv.

Workflows of 0, 3 and 10 no-op steps called sequentially (per-step cost = slope of the
medians), a DB-backed queue (enqueue→start unloaded, and a burst for steps/s; polling 50 ms
as the reference set it, DBOS's default is 1 s), and SQL statements/commits per 3-step
workflow.

    bench/.venv-peers/bin/python -m bench.peer_dbos --backend sqlite-wal|postgres [--n 500]
"""

import argparse
import os
import sys
import tempfile
import time

from bench.common import Deadline, summarize_ms, write_result

ap = argparse.ArgumentParser()
ap.add_argument("--backend", required=True, choices=["sqlite-wal", "postgres"])
ap.add_argument("--n", type=int, default=500)
ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
ap.add_argument("--name", default=None, help="result name (default dbos_<backend>[-normal])")
ap.add_argument(
    "--db-name",
    default=os.environ.get("GENEVA_BENCH_DBOS_DB", "geneva_dbos_bench"),
    help="PostgreSQL: the system database to create and drop",
)
ap.add_argument(
    "--sync-normal",
    action="store_true",
    help="SQLite: synchronous=NORMAL on every connection (the engine's durability level)",
)
args = ap.parse_args()

import sqlalchemy as sa  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

workdir = tempfile.mkdtemp(prefix="dbos-peer-")
if args.backend == "sqlite-wal":
    import sqlite3

    db_path = os.path.join(workdir, "dbos.sqlite")
    c = sqlite3.connect(db_path)
    c.execute("PRAGMA journal_mode=WAL")  # DBOS leaves SQLite's default journal; WAL is fairer
    c.close()
    sys_url = f"sqlite:///{db_path}"
    if args.sync_normal:

        @event.listens_for(Engine, "connect")
        def _normal(dbapi_connection, _record):
            cur = dbapi_connection.cursor()
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
else:
    assert "127.0.0.1" in args.pg_url, "loopback only"
    admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)'))
    admin.dispose()
    sys_url = args.pg_url.rsplit("/", 1)[0] + "/" + args.db_name

from dbos import DBOS  # noqa: E402

DBOS(config={"name": "genevabench", "system_database_url": sys_url, "log_level": "WARNING"})


@DBOS.step()
def noop_step(x):
    return x


@DBOS.workflow()
def wf0(x):
    return x


@DBOS.workflow()
def wf3(x):
    x = noop_step(x)
    x = noop_step(x)
    return noop_step(x)


@DBOS.workflow()
def wf10(x):
    for _ in range(10):
        x = noop_step(x)
    return x


START = {}
END = {}


@DBOS.workflow()
def wf3_timed(x, t_enq):
    START[x] = time.time() - t_enq
    y = noop_step(x)
    y = noop_step(y)
    y = noop_step(y)
    END[x] = time.time()
    return y


DBOS.launch()
queue = DBOS.register_queue("geneva_bench_q", polling_interval_sec=0.05)
N = args.n
res = {
    "backend": args.backend,
    "n": N,
    "system_database": sys_url.split("@")[-1],
    "sqlite_synchronous": ("NORMAL" if args.sync_normal else "FULL (default)")
    if args.backend != "postgres"
    else None,
}
try:
    from importlib.metadata import version

    res["dbos_version"] = version("dbos")
except Exception:
    pass


def seq(fn, n, label):
    lat = []
    dl = Deadline(120)
    t0 = time.perf_counter()
    for i in range(n):
        if dl.expired():
            break
        a = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - a)
    el = time.perf_counter() - t0
    out = summarize_ms(lat)
    out["workflows_per_s"] = round(len(lat) / el, 1)
    res[label] = out
    print(f"[dbos {args.backend}] {label}: {out}", file=sys.stderr)
    return out


for i in range(20):
    wf3(10_000_000 + i)
s0 = seq(lambda i: wf0(1_000_000 + i), N, "seq_wf0")
s3 = seq(lambda i: wf3(2_000_000 + i), N, "seq_wf3")
s10 = seq(lambda i: wf10(3_000_000 + i), max(1, N // 3), "seq_wf10")
res["seq_wf3"]["steps_per_s"] = round(s3["workflows_per_s"] * 3, 1)
res["ms_per_step_wf3_total"] = round(1000 / res["seq_wf3"]["steps_per_s"], 3)
res["marginal_ms_per_step"] = round((s10["p50_ms"] - s3["p50_ms"]) / 7, 3)
res["per_workflow_fixed_ms"] = s0["p50_ms"]

# unloaded queue: enqueue -> workflow start
START.clear()
dl = Deadline(60)
for i in range(min(50, N)):
    if dl.expired():
        break
    queue.enqueue(wf3_timed, 7_000_000 + i, time.time()).get_result(polling_interval_sec=0.005)
res["queue_unloaded_enqueue_to_start"] = summarize_ms(list(START.values()))

# queue burst: steps/s
START.clear()
END.clear()
t0w = time.time()
handles = [queue.enqueue(wf3_timed, 6_000_000 + i, time.time()) for i in range(N)]
dl = Deadline(180)
done = 0
for h in handles:
    if dl.expired():
        break
    h.get_result(polling_interval_sec=0.01)
    done += 1
el = (max(END.values()) - t0w) if END else float("nan")
res["queue_burst"] = {
    "workflows": N,
    "completed": done,
    "wall_s": round(el, 3),
    "steps_per_s": round(3 * done / el, 1),
    "enqueue_to_start": summarize_ms(list(START.values())),
}

counts = {"stmts": 0, "commits": 0}


def _stmt(*a, **k):
    counts["stmts"] += 1


def _commit(*a, **k):
    counts["commits"] += 1


event.listen(Engine, "before_cursor_execute", _stmt)
event.listen(Engine, "commit", _commit)
for i in range(50):
    wf3(8_000_000 + i)
event.remove(Engine, "before_cursor_execute", _stmt)
event.remove(Engine, "commit", _commit)
res["sql_per_step"] = {
    "statements": round(counts["stmts"] / 150, 2),
    "commits": round(counts["commits"] / 150, 2),
}
print(f"[dbos {args.backend}] {res}", file=sys.stderr)
DBOS.destroy()
if args.backend == "postgres":
    admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)'))
    admin.dispose()
write_result(args.name or f"dbos_{args.backend}" + ("-normal" if args.sync_normal else ""), res)
