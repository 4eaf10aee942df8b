"""What the dashboard, the gauges, housekeeping and the dispatch claim cost as
history grows behind a live set of fixed size.

Seeds a fresh PostgreSQL database with ``--workflows`` workflows (seven executions and one
signal each) by bulk ``INSERT … SELECT generate_series``, building the secondary indexes after
the rows: ``--live`` of them ongoing or paused (a mix of ready, scheduled, overdue, parked at a
signal, in progress, stuck and paused after a failure), the rest history that ended at
``--per-day`` workflows a day (finished, canceled, a failed attempt in every tenth). Then:

- prints ``EXPLAIN (ANALYZE, BUFFERS)`` for each statement that grew with history (the failures
  window, the signal inbox, the Definitions drain count, ``?due=stuck``, housekeeping's cleanup
  candidates with nothing to delete, the dispatch claim deep into the due backlog, the counts);
- times each dashboard page server-side (Flask's test client, median of ``--repeats``), an
  uncached ``/metrics`` snapshot and a housekeeping pass with nothing to do;
- checks that the counts the overview shows equal an exact SQL count.

    .venv/bin/python -m bench.engine_growth --workflows 10000
    .venv/bin/python -m bench.engine_growth --workflows 1000000 --keep --json /tmp/g1m.json
    .venv/bin/python -m bench.engine_growth --workflows 1000000 --reuse   # measure again

``--database`` names the database it drops and creates (default ``geneva_growth``) on
``--server`` (default the shared test server); ``--reuse`` measures the one a ``--keep`` run
left. ``--without-0007`` drops migration 0007's indexes after seeding: the plans and times
before those indexes. Disk: about 3 KB per workflow (10M: about 30 GB). Results are printed as text
and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, create_engine, text

from bench.common import RECOUNT_SQL

SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
EXECUTIONS_PER_WORKFLOW = 7
INDEXES_0007 = (
    "index_geneva_drive_step_executions_due",
    "index_geneva_drive_step_executions_failed_at",
    "index_geneva_drive_signals_pending",
    "index_geneva_drive_workflows_terminal_transitioned",
)

# One workflow class of the dashboard's test suite stands for every class: the pages read the
# same tables whatever the class. Its steps are authorize, legacy_capture (removed), charge,
# confirm (a signal wait) and ship.
WORKFLOW_CLASS = "GrowthPayment"

# History and the live set are seeded apart, as a deployment has them: the live set (ongoing
# and paused workflows, ``--live``) is what the dashboard, the gauges and the dispatcher act on,
# and stays the same size however much history piles up behind it; history (``--workflows``
# minus the live set) ended at ``--per-day`` workflows a day, the newest two minutes ago, so
# the last day always holds one day of activity and the oldest is ``history / per-day`` days old.
#
# History, by ``id % 100``: 0-94 finished, 95-99 canceled; every tenth failed once at charge (an
# attempt, then the step succeeded on its reattempt). The live set, by ``(id - history) % 15``:
# 0-3 paused after a failure at charge, 4-8 ready with a scheduled execution of ship (one in
# fifty of them overdue by minutes), 9-11 parked at confirm (a signal wait), 12-13 in progress
# at charge, 14 in progress at charge and stuck (started two hours ago). A live workflow's
# current execution is of the step its row names (before 2026-12-04 every seventh execution was
# named ship, so the parked ones looked stranded to housekeeping).
SEED = [
    """
    INSERT INTO geneva_drive_workflows (id, type, hero_type, hero_id, state, current_step_name,
        next_step_name, allow_multiple, started_at, transitioned_at, created_at, updated_at)
    SELECT g, :cls, 'Order', g::text,
        CASE WHEN g <= :h AND g % 100 < 95 THEN 'finished' WHEN g <= :h THEN 'canceled'
             WHEN (g - :h) % 15 < 4 THEN 'paused' WHEN (g - :h) % 15 < 12 THEN 'ready'
             ELSE 'performing' END,
        CASE WHEN g > :h AND (g - :h) % 15 >= 12 THEN 'charge' END,
        CASE WHEN g <= :h THEN NULL WHEN (g - :h) % 15 < 4 THEN 'charge'
             WHEN (g - :h) % 15 < 9 THEN 'ship' WHEN (g - :h) % 15 < 12 THEN 'confirm'
             ELSE 'ship' END,
        true,
        t.ended - interval '10 minutes', t.ended, t.ended - interval '10 minutes', t.ended
    FROM generate_series(1, :n) AS g,
        LATERAL (SELECT CASE WHEN g <= :h
            THEN now() - interval '2 minutes' - make_interval(secs => (:h - g) * 86400.0 / :per_day)
            ELSE now() - make_interval(secs => (:n - g) * 3600.0 / GREATEST(:n - :h, 1)) END
            AS ended) AS t
    """,
    # Seven executions per workflow: the first six are history (a failed attempt at charge for
    # every tenth), the seventh is the workflow's last one (history) or its current one (live).
    """
    INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state, outcome,
        scheduled_for, started_at, completed_at, failed_at, finished_at, error_class_name,
        error_message, created_at, updated_at, sent_at, waiting_since)
    SELECT w,
        CASE WHEN k = 7 AND w > :h THEN (ARRAY['charge','ship','confirm','charge'])[
                CASE WHEN (w - :h) % 15 < 4 THEN 1 WHEN (w - :h) % 15 < 9 THEN 2
                     WHEN (w - :h) % 15 < 12 THEN 3 ELSE 4 END]
             ELSE (ARRAY['authorize','legacy_capture','charge','charge','confirm','ship','ship'])[k]
        END,
        x.state, NULL,
        x.at, CASE WHEN x.state NOT IN ('scheduled', 'waiting') THEN x.at - interval '200 ms' END,
        NULL,
        CASE WHEN x.state = 'failed' THEN x.at END,
        CASE WHEN x.state IN ('completed', 'failed', 'canceled') THEN x.at END,
        CASE WHEN x.state = 'failed' THEN 'builtins.RuntimeError' END,
        CASE WHEN x.state = 'failed' THEN 'card declined' END,
        x.at, x.at,
        CASE WHEN x.state = 'scheduled' THEN now() END,
        CASE WHEN x.state = 'waiting' THEN x.at END
    FROM generate_series(1, :n) AS w, generate_series(1, 7) AS k,
        LATERAL (SELECT
            CASE
                WHEN k = 3 AND w % 10 = 0 THEN 'failed'
                WHEN k < 7 OR (w <= :h AND w % 100 < 95) THEN 'completed'
                WHEN w <= :h THEN 'canceled'
                WHEN (w - :h) % 15 < 4 THEN 'failed'
                WHEN (w - :h) % 15 < 9 THEN 'scheduled'
                WHEN (w - :h) % 15 < 12 THEN 'waiting'
                ELSE 'in_progress' END AS state,
            CASE
                WHEN w <= :h THEN now() - interval '2 minutes'
                    - make_interval(secs => (:h - w) * 86400.0 / :per_day + (7 - k) * 60)
                WHEN k < 7 THEN now() - make_interval(secs => (:n - w) * 3600.0
                    / GREATEST(:n - :h, 1) + (7 - k) * 5)
                WHEN (w - :h) % 15 BETWEEN 4 AND 8 AND w % 50 = 0
                    THEN now() - make_interval(mins => 3 + w % 7)
                WHEN (w - :h) % 15 BETWEEN 4 AND 8 THEN now() + make_interval(secs => w % 3600)
                WHEN (w - :h) % 15 = 14 THEN now() - interval '2 hours'
                ELSE now() - make_interval(secs => (:n - w) % 600) END AS at) AS x
    """,
    # One signal per workflow: consumed, but pending for the paused and one in five ready ones.
    """
    INSERT INTO geneva_drive_signals (workflow_id, name, state, claimed, consumed, created_at,
        updated_at)
    SELECT g, 'confirm',
        CASE WHEN g > :h AND ((g - :h) % 15 < 4 OR ((g - :h) % 15 < 9 AND g % 5 = 0))
             THEN 'pending' ELSE 'consumed' END,
        0, 0, w.created_at, w.created_at
    FROM generate_series(1, :n) AS g JOIN geneva_drive_workflows AS w ON w.id = g
    """,
    "SELECT setval(pg_get_serial_sequence('geneva_drive_workflows', 'id'), :n)",
]

#: The tables the seed fills; their secondary indexes are built after the rows (much faster).
SEEDED_TABLES = ("geneva_drive_workflows", "geneva_drive_step_executions", "geneva_drive_signals")

# The same seed on MariaDB: its sequence engine's ``seq_A_to_B`` tables stand for
# ``generate_series``, ``@now`` (set once per seed) for the transaction's ``now()``, and
# ``INTERVAL … MICROSECOND`` for ``make_interval``. MariaDB has no LATERAL: the per-row values
# are computed in a derived table. Rows go in chunks of ``MARIADB_CHUNK`` workflows, one
# transaction each, in primary-key order (``STRAIGHT_JOIN``: workflow outer, step inner).
MARIADB_CHUNK = 50_000
MARIADB_SEED = [
    """
    INSERT INTO geneva_drive_workflows (id, type, hero_type, hero_id, state, current_step_name,
        next_step_name, allow_multiple, started_at, transitioned_at, created_at, updated_at)
    SELECT g, :cls, 'Order', CAST(g AS CHAR),
        CASE WHEN g <= :h AND g % 100 < 95 THEN 'finished' WHEN g <= :h THEN 'canceled'
             WHEN (g - :h) % 15 < 4 THEN 'paused' WHEN (g - :h) % 15 < 12 THEN 'ready'
             ELSE 'performing' END,
        CASE WHEN g > :h AND (g - :h) % 15 >= 12 THEN 'charge' END,
        CASE WHEN g <= :h THEN NULL WHEN (g - :h) % 15 < 4 THEN 'charge'
             WHEN (g - :h) % 15 < 9 THEN 'ship' WHEN (g - :h) % 15 < 12 THEN 'confirm'
             ELSE 'ship' END,
        1,
        ended - INTERVAL 10 MINUTE, ended, ended - INTERVAL 10 MINUTE, ended
    FROM (SELECT seq AS g, CASE WHEN seq <= :h
            THEN @now - INTERVAL 2 MINUTE
                - INTERVAL ROUND((:h - seq) * 86400000000 / :per_day) MICROSECOND
            ELSE @now - INTERVAL ROUND((:n - seq) * 3600000000 / GREATEST(:n - :h, 1))
                MICROSECOND END AS ended
        FROM seq_{first}_to_{last}) AS t
    """,
    """
    INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state, outcome,
        scheduled_for, started_at, completed_at, failed_at, finished_at, error_class_name,
        error_message, created_at, updated_at, sent_at, waiting_since)
    SELECT w,
        CASE WHEN k = 7 AND w > :h THEN ELT(
                CASE WHEN (w - :h) % 15 < 4 THEN 1 WHEN (w - :h) % 15 < 9 THEN 2
                     WHEN (w - :h) % 15 < 12 THEN 3 ELSE 4 END,
                'charge', 'ship', 'confirm', 'charge')
             ELSE ELT(k, 'authorize', 'legacy_capture', 'charge', 'charge', 'confirm', 'ship', 'ship')
        END,
        st, NULL,
        at, CASE WHEN st NOT IN ('scheduled', 'waiting') THEN at - INTERVAL 200000 MICROSECOND END,
        NULL,
        CASE WHEN st = 'failed' THEN at END,
        CASE WHEN st IN ('completed', 'failed', 'canceled') THEN at END,
        CASE WHEN st = 'failed' THEN 'builtins.RuntimeError' END,
        CASE WHEN st = 'failed' THEN 'card declined' END,
        at, at,
        CASE WHEN st = 'scheduled' THEN @now END,
        CASE WHEN st = 'waiting' THEN at END
    FROM (SELECT w.seq AS w, k.seq AS k,
            CASE
                WHEN k.seq = 3 AND w.seq % 10 = 0 THEN 'failed'
                WHEN k.seq < 7 OR (w.seq <= :h AND w.seq % 100 < 95) THEN 'completed'
                WHEN w.seq <= :h THEN 'canceled'
                WHEN (w.seq - :h) % 15 < 4 THEN 'failed'
                WHEN (w.seq - :h) % 15 < 9 THEN 'scheduled'
                WHEN (w.seq - :h) % 15 < 12 THEN 'waiting'
                ELSE 'in_progress' END AS st,
            CASE
                WHEN w.seq <= :h THEN @now - INTERVAL 2 MINUTE - INTERVAL
                    ROUND((:h - w.seq) * 86400000000 / :per_day + (7 - k.seq) * 60000000)
                    MICROSECOND
                WHEN k.seq < 7 THEN @now - INTERVAL ROUND((:n - w.seq) * 3600000000
                    / GREATEST(:n - :h, 1) + (7 - k.seq) * 5000000) MICROSECOND
                WHEN (w.seq - :h) % 15 BETWEEN 4 AND 8 AND w.seq % 50 = 0
                    THEN @now - INTERVAL (3 + w.seq % 7) MINUTE
                WHEN (w.seq - :h) % 15 BETWEEN 4 AND 8 THEN @now + INTERVAL (w.seq % 3600) SECOND
                WHEN (w.seq - :h) % 15 = 14 THEN @now - INTERVAL 2 HOUR
                ELSE @now - INTERVAL ((:n - w.seq) % 600) SECOND END AS at
        FROM seq_{first}_to_{last} AS w STRAIGHT_JOIN seq_1_to_7 AS k) AS x
    """,
    """
    INSERT INTO geneva_drive_signals (workflow_id, name, state, claimed, consumed, created_at,
        updated_at)
    SELECT g.seq, 'confirm',
        CASE WHEN g.seq > :h AND ((g.seq - :h) % 15 < 4 OR ((g.seq - :h) % 15 < 9 AND g.seq % 5 = 0))
             THEN 'pending' ELSE 'consumed' END,
        0, 0, w.created_at, w.created_at
    FROM seq_{first}_to_{last} AS g JOIN geneva_drive_workflows AS w ON w.id = g.seq
    """,
]


def _workflow_class() -> Any:
    from geneva_drive import Workflow, removed_step, step

    class GrowthPayment(Workflow):
        workflow_name = WORKFLOW_CLASS
        may_proceed_without_hero = True

        @step
        def authorize(self) -> None:
            pass

        legacy_capture = removed_step()

        @step
        def charge(self) -> None:
            pass

        @step(wait_for="confirm")
        def confirm(self) -> None:
            pass

        @step
        def ship(self) -> None:
            pass

    return GrowthPayment


def seed(url: str, workflows: int, live: int, per_day: int) -> float:
    if url.startswith("mysql"):
        return seed_mariadb(url, workflows, live, per_day)
    from geneva_drive.models import Base

    engine = create_engine(url)
    started = time.perf_counter()
    Base.metadata.create_all(engine)
    values = {"n": workflows, "h": workflows - live, "per_day": per_day, "cls": WORKFLOW_CLASS}
    with engine.begin() as connection:
        indexes = connection.execute(
            text(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = ANY(:t)"
                " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)"
            ),
            {"t": list(SEEDED_TABLES)},
        ).all()
        for name, _definition in indexes:
            connection.exec_driver_sql(f'DROP INDEX "{name}"')
        for statement in SEED:
            connection.execute(text(statement), values)
        connection.execute(text(RECOUNT_SQL))
    # Built after the rows, one by one in autocommit, with room to sort in memory.
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        connection.exec_driver_sql("SET maintenance_work_mem = '1GB'")
        for _name, definition in indexes:
            connection.exec_driver_sql(definition)
        connection.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()
    return time.perf_counter() - started


def seed_mariadb(url: str, workflows: int, live: int, per_day: int) -> float:
    """The seed on MariaDB: the tables as the engine creates them (its generated columns stand
    for PostgreSQL's partial indexes), the secondary indexes dropped, the rows in chunks, then
    the indexes added back in one ``ALTER TABLE`` per table and the statistics read."""
    from geneva_drive.models import Base

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    started = time.perf_counter()
    Base.metadata.create_all(engine)
    values = {"n": workflows, "h": workflows - live, "per_day": per_day, "cls": WORKFLOW_CLASS}
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT table_name, index_name, non_unique, column_name, sub_part"
                " FROM information_schema.statistics WHERE table_schema = DATABASE()"
                " AND table_name IN :t AND index_name <> 'PRIMARY'"
                " ORDER BY table_name, index_name, seq_in_index"
            ).bindparams(bindparam("t", expanding=True)),
            {"t": list(SEEDED_TABLES)},
        ).all()
        indexes: dict[tuple[str, str], tuple[bool, list[str]]] = {}
        for table, name, non_unique, column, sub_part in rows:
            unique, columns = indexes.setdefault((table, name), (not non_unique, []))
            columns.append(f"`{column}`" + (f"({sub_part})" if sub_part else ""))
        dropped: dict[str, list[str]] = {}
        connection.exec_driver_sql("SET SESSION foreign_key_checks = 0, unique_checks = 0")
        for (table, name), (unique, columns) in indexes.items():
            try:
                connection.exec_driver_sql(f"ALTER TABLE `{table}` DROP INDEX `{name}`")
            except Exception:  # the index a foreign key needs cannot be dropped: it stays
                continue
            kind = "UNIQUE INDEX" if unique else "INDEX"
            dropped.setdefault(table, []).append(f"ADD {kind} `{name}` ({', '.join(columns)})")
        connection.exec_driver_sql("SET @now = UTC_TIMESTAMP(6)")
        for statement in MARIADB_SEED:
            for first in range(1, workflows + 1, MARIADB_CHUNK):
                last = min(first + MARIADB_CHUNK - 1, workflows)
                connection.execute(
                    text(statement.replace("{first}", str(first)).replace("{last}", str(last))),
                    values,
                )
        connection.execute(text(RECOUNT_SQL))
        for table, additions in dropped.items():
            connection.exec_driver_sql(f"ALTER TABLE `{table}` {', '.join(additions)}")
        for table in SEEDED_TABLES:
            connection.exec_driver_sql(f"ANALYZE TABLE `{table}`").all()
    engine.dispose()
    return time.perf_counter() - started


def statements(session: Any, cls: Any, cutoff: datetime) -> dict[str, tuple[str, Any]]:
    """The statements that grew with history, as the code builds them now (compiled with values)."""
    from sqlalchemy import func, select

    from geneva_drive.dashboard import queries
    from geneva_drive.dispatch import _due_query
    from geneva_drive.housekeeping import _old, _past, _rows_of_workflow, _workflows
    from geneva_drive.models import StepExecution, utcnow
    from geneva_drive.states import StepState
    from geneva_drive.workflow import Workflow

    now = utcnow()
    since = now - timedelta(hours=1)
    burst = session.execute(
        select(StepExecution.scheduled_for, StepExecution.id)
        .where(StepExecution.state == StepState.SCHEDULED)
        .order_by(StepExecution.scheduled_for, StepExecution.id)
        .offset(session.scalar(select(func.count()).where(StepExecution.state == "scheduled")) // 2)
        .limit(1)
    ).one_or_none()
    found = {
        "failures_1h": select(Workflow.type, StepExecution.step_name, func.count())
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(StepExecution.state == StepState.FAILED, StepExecution.failed_at >= since)
        .group_by(Workflow.type, StepExecution.step_name),
        "signal_inbox": select(queries.Signal)
        .where(queries.Signal.state == "pending")
        .order_by(queries.Signal.created_at, queries.Signal.id)
        .limit(100),
        "definitions_drain": None,
        "due_stuck_page": queries.filtered_workflows(queries.WorkflowFilters(due="stuck"))
        .order_by(Workflow.id.desc())
        .limit(51),
        "cleanup_candidates": select(
            _workflows.c.id, _workflows.c.transitioned_at, _rows_of_workflow()
        )
        .where(_past(None), _old(cutoff))
        .order_by(_workflows.c.transitioned_at, _workflows.c.id)
        .limit(1000),
        "dispatch_claim_mid_burst": _due_query(
            now + timedelta(days=1), 500, session, tuple(burst) if burst else None
        ),
    }
    # Before migration 0007, for comparison: cleanup's candidates in id order from id 0, and the
    # Definitions count from every execution of ongoing workflows (the engine's gem count).
    found["cleanup_candidates_before_26"] = (
        select(_workflows.c.id, _rows_of_workflow())
        .where(
            _workflows.c.id > 0,
            _workflows.c.state.in_(["finished", "canceled"]),
            _workflows.c.transitioned_at < cutoff,
        )
        .order_by(_workflows.c.id)
        .limit(1000)
    )
    # Workflows per (class, state), as the overview and /metrics read them: the counts table
    # (migration 0010) against the grouped scan of every workflow they ran before it.
    from geneva_drive.models import WorkflowCount

    found["workflow_counts"] = select(
        WorkflowCount.type, WorkflowCount.state, func.sum(WorkflowCount.count)
    ).group_by(WorkflowCount.type, WorkflowCount.state)
    found["workflow_counts_before_0010"] = select(
        Workflow.type, Workflow.state, func.count()
    ).group_by(Workflow.type, Workflow.state)
    captured: list[tuple[str, Any]] = []
    from sqlalchemy import event

    engine = session.get_bind()

    def capture(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        queries.removed_steps_current(session, cls)
        found["definitions_drain"] = captured[-1]
        cls.removed_steps_in_flight(session)
        found["definitions_drain_before_26"] = captured[-1]
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    compiled = {}
    for name, statement in found.items():
        if isinstance(statement, tuple):
            compiled[name] = statement
        else:
            literal = statement.compile(
                dialect=engine.dialect, compile_kwargs={"literal_binds": True}
            )
            compiled[name] = (str(literal), None)
    return compiled


def explain(url: str, compiled: dict[str, tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    if url.startswith("mysql"):
        return explain_mariadb(url, compiled)
    engine = create_engine(url)
    out = {}
    with engine.connect() as connection:
        for name, (sql, parameters) in compiled.items():
            rows = connection.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, parameters
            ).scalar_one()
            plan = rows[0]
            text_plan = connection.exec_driver_sql(
                "EXPLAIN (ANALYZE, BUFFERS) " + sql, parameters
            ).fetchall()
            out[name] = {
                "ms": round(plan["Execution Time"], 3),
                "buffers": plan["Plan"].get("Shared Hit Blocks", 0)
                + plan["Plan"].get("Shared Read Blocks", 0),
                "plan": "\n".join(row[0] for row in text_plan),
            }
            connection.rollback()
    engine.dispose()
    return out


def explain_mariadb(url: str, compiled: dict[str, tuple[str, Any]]) -> dict[str, dict[str, Any]]:
    """MariaDB's ``ANALYZE FORMAT=JSON`` (the statement run, its time and rows read per table)
    and ``EXPLAIN``'s table of the plan; it has no buffer counts, so ``buffers`` is the rows
    the plan read (``r_rows`` times ``r_loops``, summed over tables)."""
    engine = create_engine(url)
    out = {}
    with engine.connect() as connection:
        for name, (sql, parameters) in compiled.items():
            analyzed = json.loads(
                connection.exec_driver_sql("ANALYZE FORMAT=JSON " + sql, parameters).scalar_one()
            )
            connection.rollback()
            plan = connection.exec_driver_sql("EXPLAIN " + sql, parameters)
            header = "\t".join(plan.keys())
            text_plan = [header, *("\t".join(str(v) for v in row) for row in plan.fetchall())]
            connection.rollback()
            out[name] = {
                "ms": round(float(analyzed["query_block"].get("r_total_time_ms", 0.0)), 3),
                "buffers": round(_rows_read(analyzed)),
                "plan": "\n".join(text_plan),
            }
    engine.dispose()
    return out


def _rows_read(node: Any) -> float:
    """The rows a MariaDB ``ANALYZE FORMAT=JSON`` plan read, over every table it names."""
    if isinstance(node, list):
        return sum(_rows_read(item) for item in node)
    if not isinstance(node, dict):
        return 0.0
    here = 0.0
    if "table_name" in node and "r_rows" in node:
        here = float(node.get("r_rows") or 0) * float(node.get("r_loops") or 1)
    return here + sum(_rows_read(value) for key, value in node.items() if key != "r_rows")


def time_pages(url: str, repeats: int, newest: int) -> dict[str, float]:
    client = _client(url)
    times = {}
    # The overview's first render in a new app reads the charts' settled buckets too (each app
    # keeps them afterwards, app/charts.py): the cost after a deploy or in a new worker.
    samples = []
    for _ in range(repeats):
        fresh = _client(url)
        started = time.perf_counter()
        response = fresh.get("/", headers={"HX-Request": "true"})
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    times["/ (first render of a new app)"] = round(statistics.median(samples), 2)
    # The pages above run the metrics snapshot on every request (COUNTS_CACHE_SECONDS=0), the
    # worst case; with the default 5 s cache an operator's refreshes mostly read it from
    # memory (and a stale one is refreshed in the background).
    cached = _client(url, counts_cache_seconds=None)
    cached.get("/", headers={"HX-Request": "true"})
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = cached.get("/", headers={"HX-Request": "true"})
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    times["/ (default 5 s counts cache)"] = round(statistics.median(samples), 2)
    return times | _time_paths(client, repeats, newest)


def _client(url: str, counts_cache_seconds: float | None = 0) -> Any:
    """A test client of a new dashboard app, logged in as an operator; ``None``: the default
    counts cache."""
    from geneva_drive.dashboard import create_app

    config: dict[str, Any] = {
        "TESTING": True,
        "SECRET_KEY": "bench",
        "SQLALCHEMY_DATABASE_URI": url,
        "USERS": {"olga": {"role": "operator", "password_hash": "unused"}},
    }
    if counts_cache_seconds is not None:
        config["COUNTS_CACHE_SECONDS"] = counts_cache_seconds
    app = create_app(config)
    from geneva_drive.dashboard.auth import password_fingerprint

    client = app.test_client()
    with app.app_context():
        fingerprint = password_fingerprint("olga")
    with client.session_transaction() as session:
        session["geneva_drive.user"] = "olga"
        session["geneva_drive.iat"] = int(time.time())
        session["geneva_drive.gen"] = 0
        # The session names the password hash it was made under (the security rounds' check).
        session["geneva_drive.pwd"] = fingerprint
        session["geneva_drive.csrf"] = "x"
    return client


def _time_paths(client: Any, repeats: int, newest: int) -> dict[str, float]:
    pages = {
        "/": "/",
        "/workflows": "/workflows",
        "/workflows?due=stuck": "/workflows?due=stuck",
        "/failures?window=1h": "/failures?window=1h",
        "/failures?window=7d": "/failures?window=7d",
        "/signals": "/signals",
        "/definitions": "/definitions",
        "/definitions/<class>": f"/definitions/{WORKFLOW_CLASS}",
        "/workflows?due=overdue": "/workflows?due=overdue",
        "/workflows?state=ready": "/workflows?state=ready",
        "/workflows/<live id>": f"/workflows/{newest}",
        "/stranded": "/stranded",
        "/unexplained": "/unexplained",
        "/limits": "/limits",
        "/audit": "/audit",
    }
    times = {}
    for name, path in pages.items():
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(path, headers={"HX-Request": "true"})
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
        times[name] = round(statistics.median(samples), 2)
    return times


def time_housekeeping(repeats: int, cutoff: datetime) -> float:
    from geneva_drive import housekeeping
    from geneva_drive.housekeeping import HousekeepingReport

    samples = []
    for _ in range(repeats):
        report = HousekeepingReport()
        started = time.perf_counter()
        # Nothing to delete: ``cutoff`` lies before the oldest seeded history (a deployment
        # whose last pass took the old ones).
        housekeeping.cleanup(cutoff, report)
        samples.append((time.perf_counter() - started) * 1000)
        assert report.workflows_cleaned_up == 0
    return round(statistics.median(samples), 2)


def time_housekeeping_pass(repeats: int) -> float:
    """A whole housekeeping pass (``housekeeping.run``: cleanup, both stuck recoveries, the
    stranded-waiting release, the rollup, the gauges) with nothing to act on, median ms.

    The seed's stuck executions (started two hours ago) and overdue ones (minutes late) are
    what a deployment's earlier passes would already have recovered: the thresholds are set
    past them, so the pass reads what it reads every five minutes and changes nothing.
    """
    from geneva_drive import housekeeping
    from geneva_drive.config import settings

    kept = (settings.stuck_in_progress_threshold, settings.stuck_scheduled_threshold)
    settings.stuck_in_progress_threshold = settings.stuck_scheduled_threshold = timedelta(days=1)
    samples = []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            report = housekeeping.run()
            samples.append((time.perf_counter() - started) * 1000)
            assert not any(report.as_dict().values()), report.as_dict()
    finally:
        settings.stuck_in_progress_threshold, settings.stuck_scheduled_threshold = kept
    return round(statistics.median(samples), 2)


def time_metrics(url: str, repeats: int) -> float:
    """An uncached ``/metrics`` snapshot (every database gauge's statements), median ms."""
    from geneva_drive import db, metrics

    samples = []
    for _ in range(repeats):
        session = db.new_session()
        try:
            started = time.perf_counter()
            metrics.get_snapshot(session, max_age=0)
            samples.append((time.perf_counter() - started) * 1000)
        finally:
            session.rollback()
            session.close()
    return round(statistics.median(samples), 2)


def time_rollup(repeats: int) -> float:
    """A rollup pass a minute after the last (what every housekeeping pass does), median ms."""
    from geneva_drive import rollups
    from geneva_drive.models import utcnow

    samples = []
    for repeat in range(repeats):
        moment = utcnow() + timedelta(minutes=repeat + 1)
        started = time.perf_counter()
        rollups.roll_up(moment)
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 2)


def failures_equal_sql() -> bool:
    """The failure groups of the last 7 days (rolled minutes + the rest) equal a grouped
    count of the failed executions themselves."""
    from sqlalchemy import func, select

    from geneva_drive import db, rollups
    from geneva_drive.models import StepExecution, utcnow
    from geneva_drive.workflow import Workflow

    session = db.new_session()
    try:
        since = utcnow() - timedelta(days=7)
        shown = {
            (g.workflow_class, g.step_name, g.error_class): g.count
            for g in rollups.failure_counts(session, since)
        }
        exact = {
            (t, step_name, error): int(n)
            for t, step_name, error, n in session.execute(
                select(
                    Workflow.type,
                    StepExecution.step_name,
                    StepExecution.error_class_name,
                    func.count(),
                )
                .join(Workflow, Workflow.id == StepExecution.workflow_id)
                .where(StepExecution.state == "failed", StepExecution.failed_at >= since)
                .group_by(Workflow.type, StepExecution.step_name, StepExecution.error_class_name)
            )
        }
        return shown == exact
    finally:
        session.close()


def counts_equal_sql(url: str) -> bool:
    """The counts the overview shows equal an exact grouped count of the workflows."""
    from sqlalchemy import func, select

    from geneva_drive import counts, db
    from geneva_drive.workflow import Workflow

    session = db.new_session()
    try:
        shown = {key: n for key, n in counts.read(session).items() if n}
        exact = {
            (t, state): int(n)
            for t, state, n in session.execute(
                select(Workflow.type, Workflow.state, func.count()).group_by(
                    Workflow.type, Workflow.state
                )
            )
        }
        return shown == exact
    finally:
        session.close()


def database_url(server: str, database: str) -> str:
    """The URL of ``database`` on ``server`` (a PostgreSQL or MariaDB URL without one)."""
    if server.startswith("mysql"):
        return f"{server}/{database}?ssl_disabled=true"
    return f"{server}/{database}"


def create_database(server: str, database: str) -> None:
    """``database`` dropped (if there) and created empty on ``server``."""
    if server.startswith("mysql"):
        from bench.common import reset_mariadb_database

        reset_mariadb_database(database, database_url(server, "mysql"))
        return
    drop_database(server, database)
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{database}"')
    admin.dispose()


def drop_database(server: str, database: str) -> None:
    if server.startswith("mysql"):
        from bench.common import drop_mariadb_database

        drop_mariadb_database(database, database_url(server, "mysql"))
        return
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workflows", type=int, default=10_000)
    parser.add_argument(
        "--live", type=int, default=10_000, help="ongoing and paused workflows (at most all)"
    )
    parser.add_argument(
        "--per-day", type=int, default=100_000, help="history: workflows ended per day"
    )
    parser.add_argument("--server", default=SERVER)
    parser.add_argument("--database", default="geneva_growth")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--without-0007", action="store_true", dest="without")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure the database a --keep run left (same --workflows/--live/--per-day)",
    )
    parser.add_argument(
        "--no-rollup",
        action="store_true",
        help="measure without the per-minute rollup (as before it: charts and failures read "
        "the executions)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    live = min(args.live, args.workflows)
    if args.without and args.server.startswith("mysql"):
        parser.error("--without-0007 is PostgreSQL's (MariaDB has no partial indexes to drop)")

    url = database_url(args.server, args.database)
    if not args.reuse:
        create_database(args.server, args.database)
    result: dict[str, Any] = {
        "workflows": args.workflows,
        "live": live,
        "per_day": args.per_day,
        "without_0007": args.without,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        if not args.reuse:
            result["seed_s"] = round(seed(url, args.workflows, live, args.per_day), 1)
        if args.without:
            engine = create_engine(url)
            with engine.begin() as connection:
                for name in INDEXES_0007:
                    connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")
            engine.dispose()

        from geneva_drive import db
        from geneva_drive.config import settings
        from geneva_drive.models import utcnow

        db.configure(url)
        history_days = (args.workflows - live) / args.per_day
        cutoff = utcnow() - timedelta(days=history_days + 1)
        settings.delete_completed_workflows_after = utcnow() - cutoff
        cls = _workflow_class()
        session = db.new_session()
        try:
            compiled = statements(session, cls, cutoff)
        finally:
            session.close()
        result["statements"] = explain(url, compiled)
        if not args.no_rollup:
            # A deployment's housekeeping has rolled up the settled minutes of the last 8
            # days (engine/rollups.py): its first pass, then one with a minute to do.
            from geneva_drive import rollups

            started = time.perf_counter()
            result["rollup_first_pass_executions"] = rollups.roll_up()
            result["rollup_first_pass_s"] = round(time.perf_counter() - started, 2)
            result["rollup_pass_ms"] = time_rollup(args.repeats)
            result["failures_7d_equal_sql"] = failures_equal_sql()
        result["pages_ms"] = time_pages(url, args.repeats, args.workflows)
        result["metrics_uncached_ms"] = time_metrics(url, args.repeats)
        result["housekeeping_nothing_to_do_ms"] = time_housekeeping(args.repeats, cutoff)
        result["housekeeping_pass_nothing_to_do_ms"] = time_housekeeping_pass(args.repeats)
        result["counts_equal_sql"] = counts_equal_sql(url)
        result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if not args.keep:
            drop_database(args.server, args.database)
    for name, found in result.get("statements", {}).items():
        print(f"--- {name}: {found['ms']} ms, {found['buffers']} buffers\n{found['plan']}\n")
    print(json.dumps({k: v for k, v in result.items() if k != "statements"}, indent=2))
    print(
        json.dumps(
            {k: (v["ms"], v["buffers"]) for k, v in result.get("statements", {}).items()},
            indent=2,
        )
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
