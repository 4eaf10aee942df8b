"""B9: /metrics scrape time with 1,000,000 workflows (and ~3M step executions) in PostgreSQL.

Not a test. Run::

    .venv/bin/python -m bench.engine_metrics                       # seeds once, then measures
    .venv/bin/python -m bench.engine_metrics --reseed --workflows 1000000
    GENEVA_BENCH_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test ...
    .venv/bin/python -m bench.engine_metrics --url sqlite:////tmp/bench_metrics.sqlite3   # SQLite

Seeds a dedicated schema (``bench_metrics``; kept between runs, ``--reseed`` rebuilds it) with
``generate_series`` in a few statements, then measures:

* ``collect``: the four grouped queries, uncached (what a scrape costs when the 5 s cache is
  stale), p50/p99 over ``--runs`` runs, and each query's plan (index used or not);
* ``scrape_uncached``: ``GET /metrics`` through the Flask app with the cache bypassed;
* ``scrape_cached``: ``GET /metrics`` within the cache period (what a scrape storm costs);
* ``scrape_stale_while_revalidate``: ``GET /metrics`` once the snapshot has expired (the usual
  case at a 15 s scrape interval): served from memory while one thread refreshes it
  (``background_refresh`` is that refresh, measured from the request);
* SQL statements per scrape (``before_cursor_execute``).

Writes JSON to ``bench/results/bench_metrics.json`` (``bench_metrics_sqlite.json`` for SQLite),
which ``bench/report.py`` renders into ``bench/RESULTS.md``, and prints it. The analysis of
the numbers is in ``bench/B9_METRICS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text

from bench.common import RECOUNT_SQL, ROOT
from geneva_drive import counts, db, metrics
from geneva_drive.models import Base

SCHEMA = "bench_metrics"
CLASSES = 10

# Workflow states by id % 1000 (per mille): most history is finished, as in production.
SEED_WORKFLOWS = """
INSERT INTO geneva_drive_workflows
    (id, type, state, allow_multiple, created_at, updated_at, transitioned_at)
SELECT g,
       'BenchWorkflow' || (g % {classes}),
       CASE WHEN g % 1000 < 700 THEN 'finished'
            WHEN g % 1000 < 750 THEN 'canceled'
            WHEN g % 1000 < 930 THEN 'ready'
            WHEN g % 1000 < 980 THEN 'paused'
            ELSE 'performing' END,
       false,
       now() - (g % 90) * interval '1 day',
       now() - (g % 90) * interval '1 hour',
       now() - (g % 90) * interval '1 hour'
FROM generate_series(1, {n}) AS g
"""

# Two completed executions per workflow (the history)...
SEED_HISTORY = """
INSERT INTO geneva_drive_step_executions
    (workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
     finished_at, created_at, updated_at)
SELECT w.id, 'step_' || s, 'completed', 'success',
       w.created_at, w.created_at, w.created_at, w.created_at, w.created_at, w.created_at
FROM geneva_drive_workflows w, generate_series(1, 2) AS s
"""

# ... and one current execution: finished/canceled ones get a third completed one; ready ones
# a scheduled one (1% overdue, the rest due later) or, for 5%, a waiting one (a fifth of them
# parked for 10 days); paused ones keep a scheduled one; performing ones are in progress
# (2% of them for 3 hours: stuck).
SEED_CURRENT = """
INSERT INTO geneva_drive_step_executions
    (workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
     waiting_since, created_at, updated_at)
SELECT w.id, 'step_3',
       CASE WHEN w.state IN ('finished', 'canceled') THEN 'completed'
            WHEN w.state = 'performing' THEN 'in_progress'
            WHEN w.state = 'ready' AND w.id % 100 < 5 THEN 'waiting'
            ELSE 'scheduled' END,
       CASE WHEN w.state IN ('finished', 'canceled') THEN 'success' END,
       CASE WHEN w.state = 'ready' AND w.id % 100 = 99 THEN now() - (w.id % 600) * interval '1 second'
            WHEN w.state IN ('ready', 'paused') THEN now() + (w.id % 30) * interval '1 day'
            ELSE now() - interval '4 hours' END,
       CASE WHEN w.state = 'performing' AND (w.id / 1000) % 50 = 0 THEN now() - interval '3 hours'
            WHEN w.state = 'performing' THEN now() - interval '5 seconds'
            WHEN w.state IN ('finished', 'canceled') THEN w.created_at END,
       CASE WHEN w.state IN ('finished', 'canceled') THEN w.created_at END,
       CASE WHEN w.state = 'ready' AND w.id % 100 < 1 THEN now() - interval '10 days'
            WHEN w.state = 'ready' AND w.id % 100 < 5 THEN now() - interval '1 hour' END,
       w.created_at, w.created_at
FROM geneva_drive_workflows w
"""


def _ts(modifier: str = "'+0 seconds'") -> str:
    """An SQLite timestamp in the engine's stored form (naive UTC, six fraction digits)."""
    return f"(strftime('%Y-%m-%d %H:%M:%S', 'now', {modifier}) || '.000000')"


# The same rows for SQLite (no generate_series, no intervals).
SQLITE_SEED = [
    f"""
    WITH RECURSIVE n(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM n WHERE g < {{n}})
    INSERT INTO geneva_drive_workflows
        (id, type, state, allow_multiple, created_at, updated_at, transitioned_at)
    SELECT g, 'BenchWorkflow' || (g % {CLASSES}),
           CASE WHEN g % 1000 < 700 THEN 'finished' WHEN g % 1000 < 750 THEN 'canceled'
                WHEN g % 1000 < 930 THEN 'ready' WHEN g % 1000 < 980 THEN 'paused'
                ELSE 'performing' END,
           0, {_ts("printf('-%d days', g % 90)")}, {_ts("printf('-%d hours', g % 90)")},
           {_ts("printf('-%d hours', g % 90)")}
    FROM n
    """,
    """
    INSERT INTO geneva_drive_step_executions
        (workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
         finished_at, created_at, updated_at)
    SELECT w.id, 'step_' || s.s, 'completed', 'success', w.created_at, w.created_at,
           w.created_at, w.created_at, w.created_at, w.created_at
    FROM geneva_drive_workflows w, (SELECT 1 AS s UNION ALL SELECT 2) s
    """,
    f"""
    INSERT INTO geneva_drive_step_executions
        (workflow_id, step_name, state, outcome, scheduled_for, started_at, completed_at,
         waiting_since, created_at, updated_at)
    SELECT w.id, 'step_3',
           CASE WHEN w.state IN ('finished', 'canceled') THEN 'completed'
                WHEN w.state = 'performing' THEN 'in_progress'
                WHEN w.state = 'ready' AND w.id % 100 < 5 THEN 'waiting'
                ELSE 'scheduled' END,
           CASE WHEN w.state IN ('finished', 'canceled') THEN 'success' END,
           CASE WHEN w.state = 'ready' AND w.id % 100 = 99
                     THEN {_ts("printf('-%d seconds', w.id % 600)")}
                WHEN w.state IN ('ready', 'paused') THEN {_ts("printf('+%d days', w.id % 30)")}
                ELSE {_ts("'-4 hours'")} END,
           CASE WHEN w.state = 'performing' AND (w.id / 1000) % 50 = 0 THEN {_ts("'-3 hours'")}
                WHEN w.state = 'performing' THEN {_ts("'-5 seconds'")}
                WHEN w.state IN ('finished', 'canceled') THEN w.created_at END,
           CASE WHEN w.state IN ('finished', 'canceled') THEN w.created_at END,
           CASE WHEN w.state = 'ready' AND w.id % 100 < 1 THEN {_ts("'-10 days'")}
                WHEN w.state = 'ready' AND w.id % 100 < 5 THEN {_ts("'-1 hours'")} END,
           w.created_at, w.created_at
    FROM geneva_drive_workflows w
    """,
]


def seed_sqlite(url: str, workflows: int, reseed: bool) -> dict[str, Any]:
    from sqlalchemy.engine.url import make_url

    path = Path(make_url(url).database or "")
    if path.exists() and not reseed:
        engine = db.make_engine(url)
        with engine.connect() as conn:
            count = conn.scalar(text("SELECT count(*) FROM geneva_drive_workflows"))
        engine.dispose()
        if count == workflows:
            return {"seeded": False, "workflows": count}
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    engine = db.make_engine(url)
    Base.metadata.create_all(engine)
    started = time.perf_counter()
    with engine.begin() as conn:
        for statement in SQLITE_SEED:
            conn.execute(text(statement.replace("{n}", str(workflows))))
        conn.execute(text(RECOUNT_SQL))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()
    engine.dispose()
    return {
        "seeded": True,
        "workflows": workflows,
        "seed_seconds": round(time.perf_counter() - started, 1),
    }


def bench_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return db.make_engine(url)
    return db.make_engine(url, connect_args={"options": f"-csearch_path={SCHEMA}"})


def seed(url: str, workflows: int, reseed: bool) -> dict[str, Any]:
    admin = db.make_engine(url)
    with admin.begin() as conn:
        exists = conn.scalar(
            text("SELECT 1 FROM information_schema.tables WHERE table_schema = :s "
                 "AND table_name = 'geneva_drive_workflows'"),
            {"s": SCHEMA},
        )  # fmt: skip
        count = (
            conn.scalar(text(f"SELECT count(*) FROM {SCHEMA}.geneva_drive_workflows"))
            if exists
            else 0
        )
        if exists and count == workflows and not reseed:
            admin.dispose()
            return {"seeded": False, "workflows": count}
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{SCHEMA}"'))
    admin.dispose()
    engine = bench_engine(url)
    Base.metadata.create_all(engine)
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text(SEED_WORKFLOWS.format(classes=CLASSES, n=workflows)))
        conn.execute(text(SEED_HISTORY))
        conn.execute(text(SEED_CURRENT))
        conn.execute(text(RECOUNT_SQL))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE geneva_drive_workflows"))
        conn.execute(text("VACUUM ANALYZE geneva_drive_step_executions"))
    seconds = time.perf_counter() - started
    engine.dispose()
    return {"seeded": True, "workflows": workflows, "seed_seconds": round(seconds, 1)}


def summarize(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(ms[-1], 2),
    }


def plans(engine: Engine) -> dict[str, str]:
    """EXPLAIN of each grouped query: the scan nodes, to show which index each one uses."""
    from datetime import timedelta

    from sqlalchemy.dialects import postgresql

    from geneva_drive.models import utcnow

    now = utcnow()
    statements = {
        "workflows by type, state (the counts table)": counts.read_statement(),
        "waiting": metrics._waiting(now - timedelta(days=7)),
        "overdue": metrics._overdue(now),
        "stuck": metrics._stuck(now - timedelta(hours=1)),
    }
    found = {}
    with engine.connect() as conn:
        conn.execute(text("SET jit = off"))  # as geneva_drive.metrics.collect does
        for name, statement in statements.items():
            compiled = statement.compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
            rows = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}")).scalars().all()
            scans = [r.strip() for r in rows if "Scan" in r or "Execution Time" in r]
            found[name] = " | ".join(scans)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument(
        "--url",
        default=os.environ.get(
            "GENEVA_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = parser.parse_args()

    result: dict[str, Any] = {
        "benchmark": "B9 /metrics scrape",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    sqlite = args.url.startswith("sqlite")
    seeder = seed_sqlite if sqlite else seed
    result["database"] = "sqlite" if sqlite else "postgresql"
    result["seed"] = seeder(args.url, args.workflows, args.reseed)
    engine = bench_engine(args.url)
    db.configure(engine=engine)
    with engine.connect() as conn:
        result["rows"] = {
            "workflows": conn.scalar(text("SELECT count(*) FROM geneva_drive_workflows")),
            "step_executions": conn.scalar(
                text("SELECT count(*) FROM geneva_drive_step_executions")
            ),
        }

    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        statements.append(statement)

    # 1. The four grouped queries, uncached (warm-up first).
    from sqlalchemy.orm import Session

    for _ in range(3):
        with Session(engine) as session:
            metrics.collect(session)
    timings = []
    for _ in range(args.runs):
        with Session(engine) as session:
            started = time.perf_counter()
            snapshot = metrics.collect(session)
            timings.append(time.perf_counter() - started)
    result["collect"] = summarize(timings)
    result["snapshot"] = {
        "classes": len(snapshot.classes),
        "workflows": snapshot.total_workflows,
        "waiting": snapshot.waiting,
        "waiting_overdue": snapshot.waiting_overdue,
        "overdue": snapshot.overdue,
        "stuck_in_progress": snapshot.stuck_in_progress,
        "oldest_overdue_seconds": round(snapshot.oldest_overdue_seconds, 1),
    }

    # 2. GET /metrics through the dashboard.
    from geneva_drive.dashboard import create_app

    flask_app = create_app(
        {
            "TESTING": True,
            "METRICS_PUBLIC": True,
            "SQLALCHEMY_DATABASE_URI": args.url,
            "SQLALCHEMY_ENGINE_OPTIONS": (
                {} if sqlite else {"connect_args": {"options": f"-csearch_path={SCHEMA}"}}
            ),
        }
    )
    client = flask_app.test_client()
    app_engine = db.get_engine()
    event.listen(app_engine, "before_cursor_execute", count)
    uncached, cached, per_scrape, sizes = [], [], [], []
    aggregates_per_scrape: list[int] = []
    for _ in range(3):
        metrics.clear_cache()
        client.get("/metrics")
    for _ in range(args.runs):
        metrics.clear_cache()
        statements.clear()
        started = time.perf_counter()
        response = client.get("/metrics")
        uncached.append(time.perf_counter() - started)
        assert response.status_code == 200
        per_scrape.append(len(statements))
        # B9's limit counts aggregate queries; PostgreSQL's ``SET LOCAL jit = off`` is not one.
        aggregates_per_scrape.append(
            sum(1 for sql in statements if not sql.lstrip().upper().startswith("SET "))
        )
        sizes.append(len(response.data))
        started = time.perf_counter()
        statements.clear()
        client.get("/metrics")
        cached.append(time.perf_counter() - started)
        assert not statements, "a cached scrape must not query"
    # An expired snapshot within the stale window: answered from memory, refreshed behind.
    stale, refresh = [], []
    metrics._cache.max_age = 0.001
    for _ in range(args.runs):
        time.sleep(0.01)
        started = time.perf_counter()
        client.get("/metrics")
        stale.append(time.perf_counter() - started)
        metrics._cache.join()
        refresh.append(time.perf_counter() - started)
    metrics._cache.max_age = metrics.CACHE_SECONDS
    result["scrape_stale_while_revalidate"] = summarize(stale)
    result["background_refresh"] = summarize(refresh)
    result["scrape_uncached"] = summarize(uncached)
    result["scrape_cached"] = summarize(cached)
    result["statements_per_uncached_scrape"] = max(per_scrape)
    result["aggregate_queries_per_uncached_scrape"] = max(aggregates_per_scrape)
    result["exposition_bytes"] = max(sizes)
    result["plans"] = {} if sqlite else plans(engine)

    # bench/report.py renders B9 into bench/RESULTS.md from this file.
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "bench_metrics_sqlite.json" if sqlite else "bench_metrics.json"
    (out / name).write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
