# ruff: noqa: RUF001  (the tables use en dashes, as bench/report.py's do)
"""Render the MariaDB section of bench/RESULTS.md from this run's JSON results.

    .venv/bin/python -m bench.report_mariadb            # run B1 and B3 on PostgreSQL and MariaDB, render
    .venv/bin/python -m bench.report_mariadb --render   # only re-render from bench/results/run/*.json

B1: bench/engine_inprocess_server.py (both databases in one run) -> bench/results/run/b1_server.json.
B3: bench/engine_celery.py --backend postgres|mariadb --scenarios hops, run back to back
(results engine_celery_postgres_h19 / engine_celery_mariadb), and the DBOS peer on PostgreSQL
(bench/peer_dbos.py in bench/.venv-peers, database gd_h19_dbos created and dropped here; DBOS
has no MariaDB backend), so that all three are measured in the same run.

The section "## MariaDB — …" is this script's own: it is replaced in place (or appended), and
bench/report.py (the full run's renderer) carries it over as a section it does not own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from bench.common import BENCH, PY, ROOT, child_env, read_result

HEADING = "## MariaDB — B1 and B3 beside PostgreSQL"
RESULTS = BENCH / "RESULTS.md"


def run(args: list[str], limit: int) -> str:
    print("==", " ".join(args), file=sys.stderr, flush=True)
    started = time.time()
    proc = subprocess.run(
        [PY, *args], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=limit
    )
    status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-800:]}"
    print(f"   {status} in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    return status


def run_dbos(n: int) -> None:
    peers = BENCH / ".venv-peers" / "bin" / "python"
    if not peers.exists():
        print("   DBOS not run: create bench/.venv-peers (bench/run.py does)", file=sys.stderr)
        return
    admin = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-qc"]
    subprocess.run([*admin, "DROP DATABASE IF EXISTS gd_h19_dbos"], check=True)
    subprocess.run([*admin, "CREATE DATABASE gd_h19_dbos"], check=True)
    try:
        print("== bench.peer_dbos --backend postgres", file=sys.stderr, flush=True)
        subprocess.run(
            [str(peers), "-m", "bench.peer_dbos", "--backend", "postgres", "--n", str(n),
             "--pg-url", "postgresql://postgres@127.0.0.1:5432/gd_h19_dbos"],
            cwd=ROOT, timeout=1800, check=False,
            env=child_env(),
        )  # fmt: skip
    finally:
        subprocess.run([*admin, "DROP DATABASE IF EXISTS gd_h19_dbos WITH (FORCE)"], check=False)


def g(d: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float | int):
        return f"{v:,.{digits}f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def render() -> str:
    b1 = read_result("b1_server") or {}
    pg = read_result("engine_celery_postgres_h19") or {}
    mdb = read_result("engine_celery_mariadb") or {}
    dbos = read_result("dbos_postgres") or {}
    lines = [HEADING, ""]
    w = lines.append
    w(
        "Produced by `.venv/bin/python -m bench.report_mariadb` (runs `bench.engine_inprocess_server` "
        "and `bench.engine_celery --backend postgres|mariadb --scenarios hops` back to back, "
        "then rewrites only this section; `--render` re-renders it from bench/out/). "
        f"Run of {f(g(b1, 'env.time'))}; same shared 2-core machine as above, MariaDB "
        f"{f(g(b1, 'mariadb.server'))} and {f(g(b1, 'postgres.server'))} on 127.0.0.1, each at "
        "its defaults (MariaDB: `innodb_flush_log_at_trx_commit=1`, every commit flushed; the "
        "engine's connections at READ COMMITTED). Load average (1 min, start→end) of B1 on "
        f"PostgreSQL {load(g(b1, 'postgres.load_1m'))}, on MariaDB {load(g(b1, 'mariadb.load_1m'))}; "
        f"at the start of B3 on PostgreSQL {load(g(pg, 'env.loadavg'))}, on MariaDB "
        f"{load(g(mdb, 'env.loadavg'))}, DBOS {load(g(dbos, 'env.loadavg'))}. On a 2-core machine "
        "that is several processes queueing for each core: the absolute figures are several "
        "times the unloaded ones (the first full run had PostgreSQL's B3 hop at 4.4 ms), so "
        "compare the rows of this section with each other, measured minutes apart."
    )
    w("")
    w("**B1 on the server databases** (bench/engine_inprocess_server.py: B1's in-process executor and "
      "no-op steps, the database over TCP; median of the repeats):")  # fmt: skip
    w("")
    w(
        "| | ms/step (3-step workflows, creation included) | marginal ms/step | steps/s | statements/step | commits/step | raw floor ms/step (3 tx, 5 rows) | raw ÷ engine |"
    )
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, label in (
        ("postgres", "GenevaDrive, PostgreSQL"),
        ("mariadb", "**GenevaDrive, MariaDB**"),
    ):
        d = b1.get(key) or {}
        w(f"| {label} | {f(d.get('ms_per_step'))} | {f(d.get('marginal_ms_per_step'))} | "
          f"{f(d.get('steps_per_s'), 0)} | {f(d.get('statements_per_step'))} | "
          f"{f(d.get('commits_per_step'))} | {f(d.get('raw_ms_per_step'))} | "
          f"{f(d.get('engine_vs_raw'), 3)} |")  # fmt: skip
    w(f"| DBOS {f(dbos.get('dbos_version'))}, PostgreSQL, sequential in-process | "
      f"{f(dbos.get('ms_per_step_wf3_total'))} | {f(dbos.get('marginal_ms_per_step'))} | "
      f"{f(g(dbos, 'seq_wf3.steps_per_s'), 0)} | {f(g(dbos, 'sql_per_step.statements'))} | "
      f"{f(g(dbos, 'sql_per_step.commits'))} | – | – |")  # fmt: skip
    w("")
    w("**B3 through a real Celery worker** (prefork -c 2, Redis; bench/engine_celery.py `hops`):")
    w("")
    w(
        "| | hop p50 ms (unloaded) | hop p99 ms | create→first step p50 ms | burst steps/s | hop p50 under burst ms |"
    )
    w("|---|---:|---:|---:|---:|---:|")
    for d, label in (
        (pg, "GenevaDrive, PostgreSQL + Redis"),
        (mdb, "**GenevaDrive, MariaDB + Redis**"),
    ):
        w(f"| {label} | {f(g(d, 'hops.unloaded_hop.p50_ms'))} | {f(g(d, 'hops.unloaded_hop.p99_ms'))} | "
          f"{f(g(d, 'hops.unloaded_create_commit_to_first_step.p50_ms'))} | "
          f"{f(g(d, 'hops.burst.steps_per_s'), 0)} | {f(g(d, 'hops.burst.hop_under_load.p50_ms'))} |")  # fmt: skip
    w(f"| DBOS, PostgreSQL, queue (50 ms polling; DBOS has no MariaDB backend) | – | – | "
      f"{f(g(dbos, 'queue_unloaded_enqueue_to_start.p50_ms'))} (enqueue→start) | "
      f"{f(g(dbos, 'queue_burst.steps_per_s'), 0)} | – |")  # fmt: skip
    w("")
    w("Reading it: MariaDB takes the same statements and commits per step as PostgreSQL (a "
      "phase's row changes go out as one multi-table UPDATE, the counterpart of PostgreSQL's "
      "data-modifying CTEs), but every commit waits for InnoDB's log flush: PostgreSQL's start "
      "commit skips its WAL flush (`synchronous_commit=off` for that transaction), for which "
      "MariaDB has no per-transaction switch. The raw floor of the same server shows how much "
      "of a step is the database's own cost.")  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def load(v: Any) -> str:
    if isinstance(v, list | tuple) and v:
        return "→".join(f"{x:.1f}" for x in v[:2]) if len(v) == 2 else f"{v[0]:.1f}"
    return "–"


def write(section: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    start = text.find(HEADING)
    if start < 0:
        RESULTS.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    end = text.find("\n## ", start + len(HEADING))
    tail = text[end:] if end >= 0 else ""
    RESULTS.write_text(text[:start] + section + tail)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not args.render:
        q = ["--quick"] if args.quick else []
        run(
            [
                "-m",
                "bench.engine_inprocess_server",
                *(["--workflows", "60", "--repeats", "1"] if args.quick else []),
            ],
            1800,
        )
        run(["-m", "bench.engine_celery", "--backend", "postgres", "--scenarios", "hops",
             "--name", "engine_celery_postgres_h19", *q], 1800)  # fmt: skip
        run(["-m", "bench.engine_celery", "--backend", "mariadb", "--scenarios", "hops", *q], 1800)
        run_dbos(60 if args.quick else 150)
    write(render())
    print(f"wrote the MariaDB section of {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
