"""B1 on the server databases: the engine's in-process bookkeeping per step on
PostgreSQL and on MariaDB, each beside its raw floor, in one run.

The same measurement as bench/engine_inprocess_sqlite.py (its EngineBench: no-op steps through the
real executor, one session per execution, the after-commit messages run in order in process)
with the database a server over TCP: every statement is a round trip and every commit waits
for the server's log flush, so these figures are mostly the database's, and the raw floor
(the same 3-transaction, 5-row step lifecycle as plain SQL) shows how much of it is.

    .venv/bin/python -m bench.engine_inprocess_server [--workflows 150] [--backends postgres,mariadb]

PostgreSQL in schema ``geneva_bench_b1`` (GENEVA_BENCH_PG_URL), MariaDB in database
``geneva_bench_b1`` (GENEVA_BENCH_MARIADB_URL), both dropped afterwards. Writes
bench/results/run/b1_server.json; bench/report_mariadb.py renders it into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from sqlalchemy import event, text

from bench.common import (
    drop_mariadb_database,
    drop_pg_schema,
    env_info,
    pg_schema_url,
    reset_mariadb_database,
    reset_pg_schema,
    write_result,
)
from bench.engine_inprocess_sqlite import EngineBench, InlineQueue
from geneva_drive import db
from geneva_drive.config import settings
from geneva_drive.models import Base
from geneva_drive.transport import set_transport

NAME = "geneva_bench_b1"


class ServerEngineBench(EngineBench):
    def __init__(self, url: str) -> None:
        self.engine = db.configure(url)
        Base.metadata.create_all(self.engine)
        self.inline = InlineQueue()
        set_transport(self.inline)
        settings.enqueue_after_commit = True
        self.counts = {"statements": 0, "commits": 0}

        @event.listens_for(self.engine, "before_cursor_execute")
        def _count(*_args: object) -> None:
            self.counts["statements"] += 1

        @event.listens_for(self.engine, "commit")
        def _commit(*_args: object) -> None:
            self.counts["commits"] += 1


def raw_floor(url: str, n: int, mariadb: bool) -> float:
    """ms per step of the raw 3-transaction, 5-row lifecycle on the same server."""
    engine = db.make_engine(url)
    auto = "BIGINT AUTO_INCREMENT PRIMARY KEY" if mariadb else "BIGSERIAL PRIMARY KEY"
    with engine.begin() as c:
        c.execute(text("DROP TABLE IF EXISTS raw_se"))
        c.execute(text("DROP TABLE IF EXISTS raw_wf"))
        c.execute(
            text(
                "CREATE TABLE raw_wf (id BIGINT PRIMARY KEY, state VARCHAR(32), cur VARCHAR(64), updated DOUBLE PRECISION)"
            )
        )
        c.execute(
            text(
                f"CREATE TABLE raw_se (id {auto}, wf BIGINT, name VARCHAR(64), state VARCHAR(32), "
                "sched DOUBLE PRECISION, started DOUBLE PRECISION, done DOUBLE PRECISION, created DOUBLE PRECISION)"
            )
        )
        c.execute(text("CREATE INDEX raw_se_wf ON raw_se (wf)"))
        c.execute(text("CREATE INDEX raw_se_state ON raw_se (state, sched)"))
        c.execute(text("INSERT INTO raw_wf (id, state, updated) VALUES (1, 'ready', 0)"))
    insert = (
        "INSERT INTO raw_se (wf, name, state, sched, created) VALUES (1, 's', 'scheduled', :n, :n)"
    )
    if not mariadb:
        insert += " RETURNING id"
    try:
        started = time.perf_counter()
        for _ in range(n):
            now = time.time()
            with engine.begin() as c:
                result = c.execute(text(insert), {"n": now})
                sid = result.lastrowid if mariadb else result.scalar_one()
                c.execute(
                    text("UPDATE raw_wf SET cur = 's', updated = :n WHERE id = 1"), {"n": now}
                )
            with engine.begin() as c:
                c.execute(
                    text(
                        "UPDATE raw_se SET state = 'in_progress', started = :n WHERE id = :i AND state = 'scheduled'"
                    ),
                    {"n": now, "i": sid},
                )
            with engine.begin() as c:
                c.execute(
                    text("UPDATE raw_se SET state = 'completed', done = :n WHERE id = :i"),
                    {"n": now, "i": sid},
                )
                c.execute(
                    text("UPDATE raw_wf SET state = 'ready', updated = :n WHERE id = 1"), {"n": now}
                )
        return (time.perf_counter() - started) * 1000 / n
    finally:
        with engine.begin() as c:
            c.execute(text("DROP TABLE IF EXISTS raw_se"))
            c.execute(text("DROP TABLE IF EXISTS raw_wf"))
        engine.dispose()


def measure(backend: str, workflows: int, repeats: int, raw_n: int) -> dict[str, Any]:
    mariadb = backend == "mariadb"
    if mariadb:
        url = reset_mariadb_database(NAME)
    else:
        reset_pg_schema(NAME)
        url = pg_schema_url(NAME)
    runs: list[dict[str, Any]] = []
    try:
        bench = ServerEngineBench(url)
        try:
            for _ in range(repeats):
                raw = raw_floor(url, raw_n, mariadb)
                result = bench.run(workflows)
                result["raw_ms_per_step"] = raw
                result["engine_vs_raw"] = raw / result["ms_per_step"]
                runs.append(result)
        finally:
            bench.close()
            db.get_engine().dispose()
    finally:
        if mariadb:
            drop_mariadb_database(NAME)
        else:
            drop_pg_schema(NAME)
    merged: dict[str, Any] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    merged["repeats"] = repeats
    merged["engine_vs_raw_all"] = [round(r["engine_vs_raw"], 3) for r in runs]
    return merged


def server_version(backend: str) -> str:
    url = reset_mariadb_database(NAME) if backend == "mariadb" else None
    try:
        engine = db.make_engine(url) if url else db.make_engine(pg_schema_url("public"))
        with engine.connect() as c:
            version = str(c.execute(text("SELECT version()")).scalar_one())
        engine.dispose()
        return version.split(" on ")[0]
    finally:
        if url:
            drop_mariadb_database(NAME)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--raw-n", type=int, default=600)
    parser.add_argument("--backends", default="postgres,mariadb")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "env": env_info(),
        "workflows": args.workflows,
        "repeats": args.repeats,
    }
    # Alternate the backends so that both see the same machine load.
    for backend in args.backends.split(","):
        started = time.time()
        load = __import__("os").getloadavg()[0]
        figures = measure(backend, args.workflows, args.repeats, args.raw_n)
        figures["server"] = server_version(backend)
        figures["elapsed_s"] = round(time.time() - started, 1)
        figures["load_1m"] = [round(load, 2), round(__import__("os").getloadavg()[0], 2)]
        result[backend] = figures
        print(f"[b1 {backend}] {figures}", file=sys.stderr)
    write_result("b1_server", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
