"""What dropping a month's partition of executions saves against deleting its rows.

On PostgreSQL, three sides in paired rounds, each on a database of its own made by
``geneva-drive migrate`` (the partitioned ones then converted with the SQL of
docs/MANUAL.md's "PostgreSQL with time-partitioned executions", read from the manual itself,
so what is measured is what is documented):

- ``delete, plain table``: the migrated table; housekeeping's cleanup deletes a month of
  finished workflows with their executions and signals, row by row in slices (the engine's
  retention, ``delete_completed_workflows_after``);
- ``delete, partitioned``: the same cleanup on the partitioned table;
- ``drop partition``: the manual's procedure, the check that nothing in the month's partition
  belongs to a workflow that is to stay, ``DETACH PARTITION`` and ``DROP TABLE``, then the
  same cleanup, which now deletes only the workflows and their signals.

Each round seeds ``--workflows`` finished workflows that ended in October 2026 (seven
executions and one signal each, created in that month) beside ``--live`` ongoing ones of
today, then times the side and reads the WAL it wrote (``pg_current_wal_lsn``) and the
executions' disk size (every partition, indexes included) before and after.

    .venv/bin/python -m bench.probe_partition_drop --workflows 200000 --rounds 3 \
        --json /tmp/partition.json

Drops its databases afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import RECOUNT_SQL
from bench.engine_growth import SERVER, create_database, database_url, drop_database

MANUAL = Path(__file__).resolve().parents[1] / "docs" / "MANUAL.md"
SECTION = "### PostgreSQL with time-partitioned executions"
MONTH = "geneva_drive_step_executions_2026_10"
SIDES = ("delete, plain table", "delete, partitioned", "drop partition")
RETENTION = timedelta(days=30)


def manual_sql() -> list[str]:
    """The ``sql`` blocks of the manual's partitioning section, in order: the conversion, then
    the partition drop."""
    text_ = MANUAL.read_text(encoding="utf-8")
    start = text_.index(SECTION)
    end = text_.find("\n## ", start)
    section = text_[start : end if end != -1 else len(text_)]
    return re.findall(r"```sql\n(.*?)```", section, flags=re.S)


def partition_statements(drop_sql: str, partition: str) -> list[str]:
    """The manual's drop procedure for ``partition``, as statements (its check first)."""
    sql = drop_sql.replace("geneva_drive_step_executions_2026_10", partition)
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


SEED = [
    """
    INSERT INTO geneva_drive_workflows (id, type, hero_type, hero_id, state, allow_multiple,
        started_at, transitioned_at, created_at, updated_at)
    SELECT g, 'GrowthPayment', 'Order', g::text,
        CASE WHEN g % 100 < 95 THEN 'finished' ELSE 'canceled' END, true,
        t.at - interval '10 minutes', t.at, t.at - interval '10 minutes', t.at
    FROM generate_series(1, :n) AS g,
        LATERAL (SELECT timestamptz '2026-10-01 00:20+00'
                 + make_interval(secs => g * (29 * 86400.0) / :n) AS at) AS t
    """,
    """
    INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state, outcome,
        scheduled_for, started_at, completed_at, finished_at, created_at, updated_at)
    SELECT w.id, (ARRAY['authorize','charge','charge','confirm','ship','ship','ship'])[k],
        'completed', 'success', x.at, x.at, x.at, x.at, x.at, x.at
    FROM geneva_drive_workflows AS w, generate_series(1, 7) AS k,
        LATERAL (SELECT w.created_at + make_interval(secs => k * 60) AS at) AS x
    WHERE w.id <= :n
    """,
    """
    INSERT INTO geneva_drive_signals (workflow_id, name, state, claimed, consumed, created_at,
        updated_at)
    SELECT id, 'confirm', 'consumed', 0, 0, created_at, created_at
    FROM geneva_drive_workflows WHERE id <= :n
    """,
    # The live set: ready workflows of today, each with a scheduled execution.
    """
    INSERT INTO geneva_drive_workflows (id, type, hero_type, hero_id, state, next_step_name,
        allow_multiple, started_at, transitioned_at, created_at, updated_at)
    SELECT :n + g, 'GrowthPayment', 'Order', (:n + g)::text, 'ready', 'ship', true,
        now(), now(), now(), now()
    FROM generate_series(1, :live) AS g
    """,
    """
    INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state, scheduled_for,
        created_at, updated_at)
    SELECT id, 'ship', 'scheduled', now() + interval '1 day', now(), now()
    FROM geneva_drive_workflows WHERE id > :n
    """,
    "SELECT setval(pg_get_serial_sequence('geneva_drive_workflows', 'id'), :n + :live)",
    RECOUNT_SQL,
]


def prepare(url: str, side: str, workflows: int, live: int) -> None:
    """A fresh migrated database for ``side``, converted where it partitions, then seeded."""
    from geneva_drive import migrations

    engine = create_engine(url)
    migrations.upgrade(engine)
    with engine.begin() as connection:
        if side != "delete, plain table":
            # The DBAPI cursor without parameters: psycopg would read format()'s %I as one.
            connection.connection.cursor().execute(
                manual_sql()[0].replace("BEGIN;", "").replace("COMMIT;", "")
            )
            connection.exec_driver_sql(
                f"CREATE TABLE {MONTH} PARTITION OF geneva_drive_step_executions"
                " FOR VALUES FROM ('2026-10-01 00:00+00') TO ('2026-11-01 00:00+00')"
            )
        for statement in SEED:
            connection.execute(text(statement), {"n": workflows, "live": live})
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()


def _executions_size(connection: Any) -> int:
    return int(
        connection.exec_driver_sql(
            # pg_partition_tree is empty for a table that is not partitioned.
            "SELECT coalesce((SELECT sum(pg_total_relation_size(relid))"
            " FROM pg_partition_tree('geneva_drive_step_executions')),"
            " pg_total_relation_size('geneva_drive_step_executions'))"
        ).scalar_one()
    )


def _wal(connection: Any) -> str:
    return str(connection.exec_driver_sql("SELECT pg_current_wal_lsn()").scalar_one())


def measure(url: str, side: str, workflows: int) -> dict[str, Any]:
    from geneva_drive import db, housekeeping
    from geneva_drive.config import settings
    from geneva_drive.housekeeping import HousekeepingReport

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        size_before = _executions_size(connection)
        wal_before = _wal(connection)
    out: dict[str, Any] = {}
    started = time.perf_counter()
    if side == "drop partition":
        check, *change = partition_statements(manual_sql()[1], MONTH)
        with engine.connect() as connection:
            t0 = time.perf_counter()
            blocking = connection.exec_driver_sql(check).scalar_one()
            out["check_ms"] = round((time.perf_counter() - t0) * 1000, 1)
            assert blocking == 0, f"{blocking} executions of workflows that stay"
            t0 = time.perf_counter()
            for statement in change:
                connection.exec_driver_sql(statement)
            out["detach_and_drop_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    db.configure(url)
    kept = settings.delete_completed_workflows_after
    settings.delete_completed_workflows_after = RETENTION
    try:
        report = HousekeepingReport()
        t0 = time.perf_counter()
        housekeeping.cleanup(datetime.now(UTC), report)
        out["cleanup_s"] = round(time.perf_counter() - t0, 2)
    finally:
        settings.delete_completed_workflows_after = kept
        db.get_engine().dispose()
    out["total_s"] = round(time.perf_counter() - started, 2)
    assert report.workflows_cleaned_up == workflows, report.as_dict()
    out["workflows_deleted"] = report.workflows_cleaned_up
    out["executions_deleted_by_cleanup"] = report.step_executions_cleaned_up
    with engine.connect() as connection:
        out["wal_mb"] = round(
            float(
                connection.exec_driver_sql(
                    f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{wal_before}')"
                ).scalar_one()
            )
            / 1e6,
            1,
        )
        out["executions_mb_before"] = round(size_before / 1e6, 1)
        out["executions_mb_after"] = round(_executions_size(connection) / 1e6, 1)
        left = connection.exec_driver_sql(
            "SELECT count(*) FROM geneva_drive_step_executions WHERE state = 'completed'"
        ).scalar_one()
        assert left == 0, f"{left} executions of the month left"
    engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=200_000)
    parser.add_argument("--live", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", default=SERVER)
    parser.add_argument("--json")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "workflows": args.workflows,
        "executions": args.workflows * 7,
        "live": args.live,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "rounds": [],
    }
    for number in range(args.rounds):
        # Alternate the order of the sides from round to round.
        order = SIDES if number % 2 == 0 else tuple(reversed(SIDES))
        measured: dict[str, Any] = {}
        for side in order:
            name = "geneva_partition_probe"
            create_database(args.server, name)
            try:
                url = database_url(args.server, name)
                prepare(url, side, args.workflows, args.live)
                measured[side] = measure(url, side, args.workflows)
                print(number + 1, side, measured[side], flush=True)
            finally:
                drop_database(args.server, name)
        result["rounds"].append(measured)
    result["median"] = {
        side: {
            key: statistics.median(r[side][key] for r in result["rounds"])
            for key in result["rounds"][0][side]
        }
        for side in SIDES
    }
    result["spread"] = {
        side: {
            key: [
                min(r[side][key] for r in result["rounds"]),
                max(r[side][key] for r in result["rounds"]),
            ]
            for key in ("total_s", "wal_mb")
        }
        for side in SIDES
    }
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(
        json.dumps(
            {k: result[k] for k in ("median", "spread", "load_before", "load_after")}, indent=2
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
