"""The dashboard's list page against its budget: < 100 ms server time at 1,000,000 workflows on
PostgreSQL. Not a test: machines differ; run it by hand and read the verdict.

Uses the 1M-workflow / 3M-execution PostgreSQL schema ``bench_metrics`` that
``bench/engine_metrics.py`` seeds (kept between runs; ``--reseed`` rebuilds it). Each case is
requested through the Flask test client (routing, queries, presenters, templates: server time,
no network) as the HTMX partial and as the full page, on the first page and deep pages
(keyset cursor ``after=``), unfiltered and filtered. It prints p50/p90 and SQL statements per
request, and the verdict against the budget on p50. The broader B8 scenario (detail page too,
JSON output) is ``bench/engine_dashboard.py``.

    .venv/bin/python -m bench.probe_dashboard_list [--runs 30] [--budget-ms 100] [--reseed]

Exit status 1 when a case's p50 is over the budget.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from sqlalchemy import event

from bench.common import pg_schema_url
from bench.engine_dashboard import SCHEMA, cursor_at, ensure_seed

#: (name, SQL filter used to find deep-page cursors, query string)
FILTERS = [
    ("no filter", "", ""),
    ("state=paused", "WHERE state = 'paused'", "state=paused"),
    ("class", "WHERE type = 'BenchWorkflow3'", "class=BenchWorkflow3"),
    ("state+class", "WHERE state = 'ready' AND type = 'BenchWorkflow3'", "state=ready&class=BenchWorkflow3"),
]  # fmt: skip
PAGES = (1, 100, 10_000)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--reseed", action="store_true")
    args = parser.parse_args()
    ensure_seed(args.reseed)

    from geneva_drive.dashboard import create_app

    app = create_app(
        {
            "TESTING": True,
            "DEMO": True,  # the test client is a loopback client: operator "demo", no login
            "SECRET_KEY": "bench",
            "SQLALCHEMY_DATABASE_URI": pg_schema_url(SCHEMA),
        }
    )
    statements = [0]
    with app.app_context():
        from geneva_drive.dashboard.extensions import db

        engine = db.engine
    event.listen(
        engine, "before_cursor_execute", lambda *_: statements.__setitem__(0, statements[0] + 1)
    )
    client = app.test_client()

    def measure(url: str, headers: dict[str, str]) -> dict[str, Any]:
        client.get(url, headers=headers)  # warm caches and the connection pool
        times, counts = [], []
        for _ in range(args.runs):
            statements[0] = 0
            start = time.perf_counter()
            response = client.get(url, headers=headers)
            times.append((time.perf_counter() - start) * 1000)
            counts.append(statements[0])
            assert response.status_code == 200, (url, response.status_code)
        times.sort()
        return {
            "p50": statistics.median(times),
            "p90": times[int(len(times) * 0.9) - 1],
            "statements": statistics.median(counts),
        }

    over = []
    print(f"{'case':34} {'kind':8} {'p50 ms':>8} {'p90 ms':>8} {'SQL':>5}  verdict")
    for name, where, query in FILTERS:
        for page in PAGES:
            after = cursor_at(engine, where, (page - 1) * 50)
            if page > 1 and after is None:
                continue
            params = "&".join(p for p in (query, f"after={after}" if after else "") if p)
            url = "/workflows" + (f"?{params}" if params else "")
            for kind, headers in (("partial", {"HX-Request": "true"}), ("full", {})):
                result = measure(url, headers)
                ok = result["p50"] < args.budget_ms
                if not ok:
                    over.append((name, page, kind))
                print(
                    f"{name + f' page {page:,}':34} {kind:8} {result['p50']:8.1f} "
                    f"{result['p90']:8.1f} {result['statements']:5.0f}  "
                    f"{'ok' if ok else 'OVER BUDGET'}"
                )
    if over:
        print(f"{len(over)} case(s) over {args.budget_ms:.0f} ms at p50: {over}")
        return 1
    print(f"every case under {args.budget_ms:.0f} ms at p50")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
