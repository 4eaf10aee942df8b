"""B8: dashboard list pages and the detail page at 1,000,000 workflows + 3,000,000 executions.

PostgreSQL schema ``bench_metrics``: seeded with INSERT … SELECT generate_series by
bench/engine_metrics.py's ``seed()`` (the B9 bench; kept between runs because seeding takes
minutes on this machine; ``--reseed`` rebuilds it, ``--drop`` drops it afterwards). Requests go
through the Flask test client (server time: routing, queries, templates), as the HTMX partial
(``HX-Request: true``, what paging swaps in) and as the full page:

* list pages 1, 100 and 10,000 (keyset cursor ``after=<id>``; 50 rows a page), without filter,
  with ``state=paused``, with ``class=…``, and both;
* the filters a viewer can type (none may scan the workflows table): ``step=`` and
  ``error=`` with a value nothing matches (the worst case: an unindexed filter walks every
  row to find no 50), and ``due=overdue`` / ``waiting`` / ``stuck`` (1 %, 5 % and 2 % of
  the ongoing workflows);
* the detail page of one workflow.

Reports server-time p50/p99, SQL statements and DB time per request, and deep/first ratios.

    .venv/bin/python -m bench.engine_dashboard [--quick] [--reseed] [--drop] [--schema S --name N]

``--schema`` seeds and measures another schema than the shared ``bench_metrics`` (a side
run that must not race another bench's reseed); ``--name`` writes ``results/<name>.json``
instead of the full run's ``b8_dashboard.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from sqlalchemy import event, text

from bench.common import PG_URL, drop_pg_schema, env_info, pg_schema_url, summarize_ms, write_result

SCHEMA = "bench_metrics"


#: Indexes added after the seed was first made (migration 0002): a kept schema gets them too.
LATER_INDEXES = (
    "CREATE INDEX IF NOT EXISTS index_geneva_drive_workflows_on_next_step "
    "ON geneva_drive_workflows (next_step_name, id)",
    "CREATE INDEX IF NOT EXISTS index_geneva_drive_step_executions_on_error_class "
    "ON geneva_drive_step_executions (error_class_name, state, workflow_id)",
)


def ensure_seed(reseed: bool, schema: str) -> dict[str, Any]:
    from bench import engine_metrics  # the B9 bench owns the seed

    engine_metrics.SCHEMA = schema
    seeded: dict[str, Any] = engine_metrics.seed(PG_URL, 1_000_000, reseed)
    from sqlalchemy import create_engine

    engine = create_engine(pg_schema_url(schema), isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        for statement in LATER_INDEXES:
            c.execute(text(statement))
        c.execute(text("ANALYZE geneva_drive_workflows"))
    engine.dispose()
    return seeded


def cursor_at(engine: Any, where: str, offset: int) -> int | None:
    """The keyset cursor that opens page ``offset // 50 + 1`` (the id of the row before it)."""
    if offset == 0:
        return None
    with engine.connect() as c:
        return c.execute(
            text(
                f"SELECT id FROM geneva_drive_workflows {where} ORDER BY id DESC OFFSET :o LIMIT 1"
            ),
            {"o": offset - 1},
        ).scalar()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--drop", action="store_true")
    parser.add_argument("--schema", default=SCHEMA)
    parser.add_argument("--name", default="b8_dashboard")
    args = parser.parse_args()
    runs = 15 if args.quick else 30
    res: dict[str, Any] = {
        "env": env_info(),
        "runs": runs,
        "seed": ensure_seed(args.reseed, args.schema),
    }
    from geneva_drive.dashboard import create_app

    app = create_app({
        "TESTING": True,
        "DEMO": True,
        "SECRET_KEY": "bench",
        "SQLALCHEMY_DATABASE_URI": pg_schema_url(args.schema),
    })  # fmt: skip
    stats = {"statements": 0, "db_s": 0.0}
    starts: dict[int, float] = {}
    with app.app_context():
        from geneva_drive.dashboard.extensions import db as fdb

        engine = fdb.engine

        @event.listens_for(engine, "before_cursor_execute")
        def _before(conn: Any, *_a: Any) -> None:
            stats["statements"] += 1
            starts[id(conn)] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _after(conn: Any, *_a: Any) -> None:
            stats["db_s"] += time.perf_counter() - starts.pop(id(conn), time.perf_counter())

        with engine.connect() as c:
            res["rows"] = {
                "workflows": c.execute(text("SELECT count(*) FROM geneva_drive_workflows")).scalar(),
                "step_executions": c.execute(text("SELECT count(*) FROM geneva_drive_step_executions")).scalar(),
            }  # fmt: skip
            detail_id = c.execute(text(
                "SELECT workflow_id FROM geneva_drive_step_executions WHERE state = 'scheduled' "
                "ORDER BY id DESC LIMIT 1")).scalar()  # fmt: skip
        filters = {
            "none": ("", ""),
            "state=paused": ("WHERE state = 'paused'", "state=paused"),
            "class=BenchWorkflow3": ("WHERE type = 'BenchWorkflow3'", "class=BenchWorkflow3"),
            "state+class": ("WHERE state = 'ready' AND type = 'BenchWorkflow3'", "state=ready&class=BenchWorkflow3"),
            "step=(no match)": ("WHERE next_step_name = 'no_such_step'", "step=no_such_step"),
            "error=(no match)": (
                "WHERE id IN (SELECT workflow_id FROM geneva_drive_step_executions "
                "WHERE error_class_name = 'bench.NoSuchError' AND state = 'failed')",
                "error=bench.NoSuchError"),
            "due=overdue": (
                "WHERE state IN ('ready', 'performing') AND id IN (SELECT workflow_id FROM "
                "geneva_drive_step_executions WHERE state = 'scheduled' AND scheduled_for < now())",
                "due=overdue"),
            "due=waiting": (
                "WHERE id IN (SELECT workflow_id FROM geneva_drive_step_executions WHERE state = 'waiting')",
                "due=waiting"),
            "due=stuck": (
                "WHERE id IN (SELECT workflow_id FROM geneva_drive_step_executions "
                "WHERE state = 'in_progress' AND started_at < now() - interval '1 hour')",
                "due=stuck"),
        }  # fmt: skip
        client = app.test_client()
        cases: dict[str, Any] = {}

        def measure(url: str, partial: bool) -> dict[str, Any]:
            headers = {"HX-Request": "true"} if partial else {}
            client.get(url, headers=headers)  # warm
            times, stmts, dbt = [], [], []
            status = None
            for _ in range(runs):
                stats["statements"], stats["db_s"] = 0, 0.0
                t0 = time.perf_counter()
                resp = client.get(url, headers=headers)
                times.append(time.perf_counter() - t0)
                status = resp.status_code
                stmts.append(stats["statements"])
                dbt.append(stats["db_s"])
            out = summarize_ms(times)
            out["status"] = status
            out["statements"] = statistics.median(stmts)
            out["db_ms_p50"] = round(statistics.median(dbt) * 1000, 3)
            return out

        for fname, (where, qs) in filters.items():
            for page in (1, 100, 10_000):
                after = cursor_at(engine, where, (page - 1) * 50)
                if page > 1 and after is None:
                    cases[f"{fname} page {page}"] = {"skipped": "fewer rows than that"}
                    continue
                params = "&".join(p for p in (qs, f"after={after}" if after else "") if p)
                url = "/workflows" + (f"?{params}" if params else "")
                cases[f"{fname} page {page}"] = {"url": url, "partial": measure(url, True)}
                if page == 1 or fname == "none":
                    cases[f"{fname} page {page}"]["full"] = measure(url, False)
                print(
                    f"[b8] {fname} page {page}: {cases[f'{fname} page {page}']['partial']}",
                    file=sys.stderr,
                )
        cases["detail"] = {"url": f"/workflows/{detail_id}", "full": measure(f"/workflows/{detail_id}", False),
                           "partial": measure(f"/workflows/{detail_id}", True)}  # fmt: skip
        res["cases"] = cases
        ratios = {}
        for fname in filters:
            first = cases.get(f"{fname} page 1", {}).get("partial", {}).get("p50_ms")
            deep = cases.get(f"{fname} page 10000", {}).get("partial", {}).get("p50_ms")
            if first and deep:
                ratios[fname] = round(deep / first, 2)
        res["deep_over_first_p50"] = ratios
    if args.drop:
        drop_pg_schema(args.schema)
        res["dropped"] = True
    write_result(args.name, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
