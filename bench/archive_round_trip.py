"""``geneva-drive archive`` round trip on a growth database (PostgreSQL).

On a database a ``bench.engine_growth --keep`` run left (``--database``), through the CLI an
operator runs, each step timed:

1. fingerprints the history (every finished/canceled workflow, its executions and signals) and
   the live set: per table, the row count and a sum of 60-bit hashes of every row's columns
   (order-independent, so a restore that inserts in another order still compares);
2. ``geneva-drive archive --older-than 60s --to DIR`` (the growth seed's history ended two
   minutes before it ran and more): written, verified, deleted;
3. checks that no finished/canceled workflow is left in the source and the live set's
   fingerprint is unchanged;
4. creates ``--target`` empty, ``geneva-drive migrate`` on it, then
   ``geneva-drive archive --restore DIR/*.jsonl.gz``;
5. fingerprints the target: equal to the history's fingerprint of step 1, and its workflow
   counts table equal to an exact grouped count.

    .venv/bin/python -m bench.engine_growth --workflows 1000000 --keep --database geneva_growth
    .venv/bin/python -m bench.archive_round_trip --database geneva_growth --json /tmp/a1m.json

Drops ``--target`` afterwards (``--keep`` keeps it) and the archive directory unless ``--dir``
names one; the source database stays (its history is gone: it was archived).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import child_env
from bench.engine_growth import SERVER, create_database, database_url, drop_database
from bench.engine_growth import counts_equal_sql as growth_counts_equal_sql

TABLES = ("geneva_drive_workflows", "geneva_drive_step_executions", "geneva_drive_signals")
TERMINAL = "('finished', 'canceled')"


def _row_hash(table: str) -> str:
    """A 60-bit hash of every column of a row of ``table`` (the engine's columns, by name, so
    a table made by ``create_all`` and one made by the migrations compare equal)."""
    from geneva_drive.models import Base

    parts = ", ".join(
        f"coalesce(t.{column.name}::text, '\\N')" for column in Base.metadata.tables[table].columns
    )
    return f"('x' || substr(md5(concat_ws('|', {parts})), 1, 15))::bit(60)::bigint"


def fingerprint(url: str, which: str) -> dict[str, list[int]]:
    """Per table: ``[rows, sum of row hashes]`` of ``which`` rows: "history" (rows of finished/
    canceled workflows), "live" (the others) or "all"."""
    condition = {
        "history": f"w.state IN {TERMINAL}",
        "live": f"w.state NOT IN {TERMINAL}",
        "all": "true",
    }[which]
    engine = create_engine(url)
    found = {}
    with engine.connect() as connection:
        for table in TABLES:
            joined = (
                "geneva_drive_workflows AS t JOIN geneva_drive_workflows AS w ON w.id = t.id"
                if table == "geneva_drive_workflows"
                else f"{table} AS t JOIN geneva_drive_workflows AS w ON w.id = t.workflow_id"
            )
            rows, total = connection.execute(
                text(
                    f"SELECT count(*), coalesce(sum({_row_hash(table)}::numeric), 0)"
                    f" FROM {joined} WHERE {condition}"
                )
            ).one()
            found[table] = [int(rows), int(total)]
    engine.dispose()
    return found


def cli(url: str, *arguments: str) -> tuple[float, Any]:
    """``geneva-drive ARGUMENTS`` on ``url``: seconds taken and the JSON it printed (if any)."""
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("geneva-drive")), *arguments],
        env=child_env(GENEVA_DATABASE_URL=url),
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"geneva-drive {' '.join(arguments[:3])}… exited {done.returncode}:\n{done.stderr}"
        )
    last = done.stdout.strip().splitlines()[-1:] or [""]
    try:
        return seconds, json.loads(last[0])
    except ValueError:
        return seconds, done.stdout


def counts_equal_sql(url: str) -> bool:
    """The counts table of ``url`` read as the overview reads it, equal to an exact count."""
    from geneva_drive import db

    db.configure(url)
    return growth_counts_equal_sql(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", default=SERVER)
    parser.add_argument("--database", default="geneva_growth", help="a kept growth database")
    parser.add_argument("--target", default="geneva_growth_restored")
    parser.add_argument("--dir", type=Path, help="the archive directory (default: a temporary one)")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--keep", action="store_true", help="keep the target database")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.server.startswith("mysql"):
        parser.error("the fingerprints are PostgreSQL SQL; run it on a PostgreSQL server")
    source = database_url(args.server, args.database)
    target = database_url(args.server, args.target)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="geneva-archive-"))
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "batch": args.batch,
    }
    try:
        started = time.perf_counter()
        history = fingerprint(source, "history")
        live = fingerprint(source, "live")
        result["fingerprint_s"] = round(time.perf_counter() - started, 1)
        result["history_rows"] = {table: found[0] for table, found in history.items()}
        seconds, report = cli(
            source, "archive", "--older-than", "60s", "--to", str(directory),
            "--batch", str(args.batch),
        )  # fmt: skip
        result["archive_s"] = round(seconds, 1)
        result["archive_report"] = {k: v for k, v in report.items() if k != "files"}
        files = sorted(directory.glob("*.jsonl.gz"))
        result["files"] = len(files)
        result["archive_bytes"] = sum(path.stat().st_size for path in files)
        left = fingerprint(source, "history")
        result["source_history_left"] = {table: found[0] for table, found in left.items()}
        result["source_live_unchanged"] = fingerprint(source, "live") == live
        create_database(args.server, args.target)
        seconds, _ = cli(target, "migrate")
        result["migrate_s"] = round(seconds, 1)
        seconds, report = cli(
            target, "archive", "--restore", *map(str, files), "--batch", str(args.batch)
        )
        result["restore_s"] = round(seconds, 1)
        result["restore_report"] = report
        result["restored_equal"] = fingerprint(target, "all") == history
        result["restored_counts_equal_sql"] = counts_equal_sql(target)
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if not args.keep:
            drop_database(args.server, args.target)
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = (
        result["restored_equal"]
        and result["restored_counts_equal_sql"]
        and result["source_live_unchanged"]
        and not any(result["source_history_left"].values())
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
