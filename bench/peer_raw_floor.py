"""Peer: the raw database floor of one step (3 transactions, 5 row writes, SQLAlchemy Core).

The step3 lifecycle of the original peer benchmark scripts (2026-11-29): insert the
scheduled row + update the workflow; claim; complete + update the workflow. SQLite WAL with
``synchronous=NORMAL`` (the engine's pragmas) and PostgreSQL (``synchronous_commit=on``, one
connection, schema ``geneva_bench_raw`` dropped afterwards); plus 4 PostgreSQL writers; plus the
two transactions of one engine hop (``pg_hop_pairs``), the database's share of B3's hop.

    .venv/bin/python -m bench.peer_raw_floor [--n 2000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from bench.common import (
    drop_pg_schema,
    env_info,
    pg_schema_url,
    reset_pg_schema,
    summarize_ms,
    write_result,
)
from bench.engine_inprocess_sqlite import raw_floor
from geneva_drive import db

SCHEMA = "geneva_bench_raw"


def pg_setup(engine: Engine, writers: int) -> None:
    with engine.begin() as c:
        c.execute(
            text(
                "CREATE TABLE wf (id BIGINT PRIMARY KEY, state TEXT, cur TEXT, updated DOUBLE PRECISION)"
            )
        )
        c.execute(text(
            "CREATE TABLE se (id BIGSERIAL PRIMARY KEY, wf BIGINT, name TEXT, state TEXT, "
            "sched DOUBLE PRECISION, started DOUBLE PRECISION, done DOUBLE PRECISION, created DOUBLE PRECISION)"
        ))  # fmt: skip
        c.execute(text("CREATE INDEX se_wf ON se(wf)"))
        c.execute(text("CREATE INDEX se_state ON se(state, sched)"))
        for w in range(1, writers + 1):
            c.execute(text("INSERT INTO wf (id, state, updated) VALUES (:w, 'ready', 0)"), {"w": w})


def pg_steps(engine: Engine, wf: int, n: int, lat: list[float]) -> None:
    for _ in range(n):
        a = time.perf_counter()
        now = time.time()
        with engine.begin() as c:
            sid = c.execute(
                text(
                    "INSERT INTO se (wf, name, state, sched, created) VALUES (:w,'s','scheduled',:n,:n) RETURNING id"
                ),
                {"n": now, "w": wf},
            ).scalar()
            c.execute(text("UPDATE wf SET cur='s', updated=:n WHERE id=:w"), {"n": now, "w": wf})
        with engine.begin() as c:
            c.execute(
                text(
                    "UPDATE se SET state='in_progress', started=:n WHERE id=:i AND state='scheduled'"
                ),
                {"n": now, "i": sid},
            )
        with engine.begin() as c:
            c.execute(
                text("UPDATE se SET state='completed', done=:n WHERE id=:i"), {"n": now, "i": sid}
            )
            c.execute(
                text("UPDATE wf SET state='ready', updated=:n WHERE id=:w"), {"n": now, "w": wf}
            )
        lat.append(time.perf_counter() - a)


def pg_hop_pairs(engine: Engine, wf: int, n: int, lat: list[float]) -> None:
    """The two transactions of one engine hop, as the engine issues them on PostgreSQL.

    Finalize of step k: lock the workflow and execution rows (one joined ``SELECT … FOR
    UPDATE``), write the outcome and the workflow row (one statement of data-modifying CTEs),
    insert the next execution; synchronous commit. Prepare of step k+1: the same lock, the
    start transition (both rows, and ``synchronous_commit`` off for this transaction, in one
    statement); commit. What a hop costs in the database with no Python logic around it.
    """
    lock = text(
        "SELECT wf.id, wf.state, se.id, se.state FROM wf JOIN se ON se.wf = wf.id "
        "WHERE se.id = :i FOR UPDATE"
    )
    finish = text(
        "WITH a AS (UPDATE se SET state='completed', done=:n WHERE id=:i), "
        "b AS (UPDATE wf SET state='ready', cur=NULL, updated=:n WHERE id=:w) SELECT 1"
    )
    insert = text(
        "INSERT INTO se (wf, name, state, sched, created) VALUES (:w,'s','scheduled',:n,:n) "
        "RETURNING id"
    )
    start = text(
        "WITH a AS (UPDATE se SET state='in_progress', started=:n WHERE id=:i), "
        "b AS (UPDATE wf SET state='performing', cur='s', updated=:n WHERE id=:w) "
        "SELECT set_config('synchronous_commit', 'off', true)"
    )
    with engine.begin() as c:
        sid = c.execute(insert, {"n": time.time(), "w": wf}).scalar()
        c.execute(start, {"n": time.time(), "i": sid, "w": wf})
    for _ in range(n):
        a = time.perf_counter()
        now = time.time()
        with engine.begin() as c:
            c.execute(lock, {"i": sid}).first()
            c.execute(finish, {"n": now, "i": sid, "w": wf})
            sid = c.execute(insert, {"n": now, "w": wf}).scalar()
        with engine.begin() as c:
            c.execute(lock, {"i": sid}).first()
            c.execute(start, {"n": now, "i": sid, "w": wf})
        lat.append(time.perf_counter() - a)


def pg_floor(n: int) -> dict[str, Any]:
    reset_pg_schema(SCHEMA)
    engine = db.make_engine(pg_schema_url(SCHEMA), pool_size=8)
    try:
        pg_setup(engine, 4)
        pg_steps(engine, 1, 50, [])  # warm-up
        lat: list[float] = []
        t0 = time.perf_counter()
        pg_steps(engine, 1, n, lat)
        one = time.perf_counter() - t0
        lat4: list[float] = []
        threads = [
            threading.Thread(target=pg_steps, args=(engine, w, n // 4, lat4)) for w in range(1, 5)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        four = time.perf_counter() - t0
        pg_hop_pairs(engine, 1, 50, [])  # warm-up
        hop: list[float] = []
        pg_hop_pairs(engine, 1, n, hop)
    finally:
        engine.dispose()
        drop_pg_schema(SCHEMA)
    return {
        "one_connection": {"ms_per_step": round(one * 1000 / n, 3), "steps_per_s": round(n / one, 1),
                           "step": summarize_ms(lat)},
        "four_writers": {"steps_per_s": round(len(lat4) / four, 1), "step": summarize_ms(lat4)},
        "hop_transactions": summarize_ms(hop),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    res: dict[str, Any] = {"env": env_info(), "n": args.n}
    with tempfile.TemporaryDirectory() as tmp:
        ms = raw_floor(Path(tmp) / "raw.sqlite3", args.n)
    res["sqlite_wal_normal"] = {"ms_per_step": round(ms, 3), "steps_per_s": round(1000 / ms, 1)}
    res["postgres"] = pg_floor(args.n)
    print(f"[raw floor] {res}", file=sys.stderr)
    write_result("raw_floor", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
