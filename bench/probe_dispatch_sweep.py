"""A whole dispatch sweep over a burst of due executions, timed at several sizes.

``bench/probe_dispatch_burst.py`` shows the plan of one claim deep in a burst; this one runs
what the dispatcher runs, ``geneva_drive.dispatch.dispatch_due()``, over ``--sizes`` ready
workflows with one scheduled execution each, due at **one instant** (the case that was
quadratic: 83.5 s for 100,000 before the keyset claim) and at **distinct** instants, each on a fresh
PostgreSQL database, and prints the sweep's time and its time per execution. Linear in the
burst means the time per execution stays flat as the burst grows. The messages go to a
recording transport (the sweep's cost is the database's; the broker is not the point here).

    .venv/bin/python -m bench.probe_dispatch_sweep --sizes 25000,50000,100000 --rounds 2 \
        --json /tmp/sweep.json

Drops and creates the database ``--database`` (default ``geneva_sweep``) on the shared test
server, and drops it afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import RECOUNT_SQL
from bench.engine_growth import SERVER, create_database, database_url, drop_database

SCHEDULES = {
    "one instant": "now() - interval '1 minute'",
    "distinct": "now() - interval '1 minute' - make_interval(secs => g / 1000.0)",
}


def seed(url: str, size: int, schedule: str) -> None:
    from geneva_drive.models import Base

    engine = create_engine(url)
    Base.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO geneva_drive_workflows (id, type, state, next_step_name,"
                " allow_multiple, created_at, updated_at, transitioned_at)"
                " SELECT g, 'Burst', 'ready', 'go', true, now(), now(), now()"
                " FROM generate_series(1, :n) g"
            ),
            {"n": size},
        )
        connection.execute(
            text(
                "INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state,"
                f" scheduled_for, created_at, updated_at) SELECT g, 'go', 'scheduled',"
                f" {SCHEDULES[schedule]}, now(), now() FROM generate_series(1, :n) g"
            ),
            {"n": size},
        )
        connection.execute(
            text("SELECT setval(pg_get_serial_sequence('geneva_drive_workflows', 'id'), :n)"),
            {"n": size},
        )
        connection.execute(text(RECOUNT_SQL))
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()


def sweep(url: str, size: int) -> dict[str, Any]:
    from geneva_drive import db, dispatch
    from geneva_drive.transport import RecordingTransport, set_transport

    recording = RecordingTransport()
    set_transport(recording)
    db.configure(url)
    try:
        started = time.perf_counter()
        sent = dispatch.dispatch_due()
        took = time.perf_counter() - started
    finally:
        db.get_engine().dispose()
    assert sent == size, (sent, size)
    return {"s": round(took, 2), "us_per_execution": round(took / size * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="25000,50000,100000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server", default=SERVER)
    parser.add_argument("--database", default="geneva_sweep")
    parser.add_argument("--json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) > 100_000:
        parser.error("a size above 100,000 is not for a shared machine")
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "rounds": [],
    }
    for number in range(args.rounds):
        order = sizes if number % 2 == 0 else list(reversed(sizes))
        measured: dict[str, Any] = {}
        for schedule in SCHEDULES:
            for size in order:
                create_database(args.server, args.database)
                try:
                    url = database_url(args.server, args.database)
                    seed(url, size, schedule)
                    measured[f"{schedule} {size}"] = sweep(url, size)
                    print(number + 1, schedule, size, measured[f"{schedule} {size}"], flush=True)
                finally:
                    drop_database(args.server, args.database)
        result["rounds"].append(measured)
    result["median"] = {
        key: {
            field: statistics.median(r[key][field] for r in result["rounds"])
            for field in ("s", "us_per_execution")
        }
        for key in result["rounds"][0]
    }
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({k: result[k] for k in ("median", "load_before", "load_after")}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
