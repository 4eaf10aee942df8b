# ruff: noqa: RUF001  (the tables use en dashes, as bench/report.py's do)
"""What schedules cost a dispatcher sweep when none is due (docs/MANUAL.md, "Recurring work").

10,000 runtime schedules (``Schedule.create``, an interval of a day, none due) in a database of
their own; then :func:`geneva_drive.schedules.fire_due` - the part of every sweep that fires
schedules - timed ``--rounds`` times in wall and process CPU time, on SQLite (a file) and, when
it answers, PostgreSQL (a schema of its own on ``GENEVA_TEST_PG_URL``). The figure is the
median round with its spread; the target is 5 ms. The section "## Schedules" of
bench/RESULTS.md is written from the run (bench/report.py carries it over)::

    .venv/bin/python -m bench.schedules_sweep [--schedules 10000 --rounds 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from geneva_drive import Schedule, Workflow, db, schedules, step
from geneva_drive.models import Base, ScheduleRow, utcnow

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADING = "## Schedules: a sweep with 10,000 schedules, none due"
PG_URL = os.environ.get("GENEVA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


class BenchScheduled(Workflow):
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        pass


def _seed(count: int) -> None:
    now = utcnow()
    rows = [
        Schedule(every=timedelta(days=1), name=f"bench:{i}").new_row(
            BenchScheduled.workflow_name, source="runtime", now=now
        )
        for i in range(count)
    ]
    with db.transaction() as session:
        session.add_all(rows)


def _measure(rounds: int) -> dict[str, list[float]]:
    schedules.fire_due()  # the first call writes the code's schedules (none here) and caches
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.process_time()
        report = schedules.fire_due()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        assert report.created == 0
    return {"wall_ms": wall, "cpu_ms": cpu}


def _sqlite(count: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        engine = db.configure(f"sqlite:///{Path(directory) / 'bench.sqlite3'}")
        Base.metadata.create_all(engine)
        _seed(count)
        try:
            return _measure(rounds)
        finally:
            engine.dispose()


def _postgresql(count: int, rounds: int) -> dict[str, list[float]] | None:
    schema = f"gd_sched_{uuid.uuid4().hex[:8]}"
    try:
        admin = db.make_engine(PG_URL)
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as error:  # no server: the SQLite figure alone
        print(f"PostgreSQL not reachable ({error}); skipped")
        return None
    try:
        engine = db.configure(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
        Base.metadata.create_all(engine)
        _seed(count)
        with engine.begin() as connection:
            connection.execute(text(f'ANALYZE "{schema}".{ScheduleRow.__tablename__}'))
        try:
            return _measure(rounds)
        finally:
            engine.dispose()
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _line(name: str, values: list[float]) -> str:
    return (
        f"| {name} | **{statistics.median(values):.2f}** | {min(values):.2f}–{max(values):.2f} "
        f"| {'met' if statistics.median(values) <= 5.0 else 'not met'} |"
    )


def _render(count: int, rounds: int, results: dict[str, Any], started: str, load: str) -> str:
    lines = [
        HEADING,
        "",
        f"`.venv/bin/python -m bench.schedules_sweep --schedules {count} --rounds {rounds}` "
        f"(bench/schedules_sweep.py), {started}; 1-minute load at the start {load}. "
        f"{count:,} runtime schedules, none due; `schedules.fire_due()`, the schedules part of "
        "every dispatcher sweep, timed per call (its first call, which writes the code's "
        "schedules, is not counted). Target: ≤ 5 ms.",
        "",
        "| database, per sweep | median ms | spread | target |",
        "|---|---:|---:|---|",
    ]
    for name, found in results.items():
        if found is None:
            continue
        lines.append(_line(f"{name}, wall", found["wall_ms"]))
        lines.append(_line(f"{name}, process CPU", found["cpu_ms"]))
    lines += [
        "",
        "The sweep reads the due rows through the index on `next_fire_at` (`next_fire_at <= now`, "
        "LIMIT 100): with none due it is one index probe, whatever the number of schedules; the "
        "code's schedules are compared by a fingerprint and written only when they change.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = f"{os.getloadavg()[0]:.1f}"
    results = {
        "SQLite": _sqlite(args.schedules, args.rounds),
        "PostgreSQL": _postgresql(args.schedules, args.rounds),
    }
    section = _render(args.schedules, args.rounds, results, started, load)
    print(section)
    text_now = RESULTS.read_text()
    if HEADING in text_now:
        head, rest = text_now.split(HEADING, 1)
        tail = rest.split("\n## ", 1)
        text_now = head + section + ("\n\n## " + tail[1] if len(tail) > 1 else "\n")
    else:
        text_now = text_now.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text_now)


if __name__ == "__main__":
    main()
