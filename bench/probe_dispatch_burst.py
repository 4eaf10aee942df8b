"""The dispatch claim deep into a burst of executions due at one instant.

Seeds ``--burst`` ready workflows, each with one scheduled execution, all due at the same
``scheduled_for``, marks the first ``--sent`` of them (in claim order) as sent by this sweep, and
prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the next 500-row claim three ways: as before the keyset
claim (no keyset, the ``(state, scheduled_for)`` index: every batch sorts the backlog and passes the
sent rows again), with the new partial ``(scheduled_for, id)`` index but no keyset, and as now
(index and keyset: the claim starts where the last batch stopped).

    .venv/bin/python -m bench.probe_dispatch_burst --burst 100000 --sent 50000

Drops and creates the database ``--database`` (default ``geneva_burst``) on the shared test
server, and drops it afterwards.
"""

from __future__ import annotations

import argparse
import re

from sqlalchemy import create_engine, text

SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
CLAIM = """
SELECT e.*, w.* FROM geneva_drive_step_executions e
JOIN geneva_drive_workflows w ON w.id = e.workflow_id
WHERE e.state = 'scheduled' AND e.scheduled_for <= now() AND w.state = 'ready'
  AND (e.sent_at IS NULL OR e.sent_at < now() - interval '2 minutes') {keyset}
ORDER BY e.scheduled_for, e.id LIMIT 500 FOR UPDATE OF e SKIP LOCKED
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--sent", type=int, default=50_000)
    parser.add_argument("--database", default="geneva_burst")
    args = parser.parse_args()
    if args.burst > 100_000:
        parser.error("--burst above 100,000 is not for a shared machine")
    from geneva_drive.models import Base

    admin = create_engine(f"{SERVER}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        connection.exec_driver_sql(f'CREATE DATABASE "{args.database}"')
    engine = create_engine(f"{SERVER}/{args.database}")
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO geneva_drive_workflows (id, type, state, allow_multiple,"
                    " created_at, updated_at) SELECT g, 'Burst', 'ready', true, now(), now()"
                    " FROM generate_series(1, :n) g"
                ),
                {"n": args.burst},
            )
            connection.execute(
                text(
                    "INSERT INTO geneva_drive_step_executions (workflow_id, step_name, state,"
                    " scheduled_for, created_at, updated_at) SELECT g, 'go', 'scheduled',"
                    " now() - interval '1 minute', now(), now() FROM generate_series(1, :n) g"
                ),
                {"n": args.burst},
            )
            connection.execute(
                text(
                    "UPDATE geneva_drive_step_executions SET sent_at = now() WHERE id IN"
                    " (SELECT id FROM geneva_drive_step_executions ORDER BY scheduled_for, id"
                    " LIMIT :k)"
                ),
                {"k": args.sent},
            )
        with engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE"
            )
        with engine.connect() as connection:
            last = connection.execute(
                text(
                    "SELECT scheduled_for, id FROM geneva_drive_step_executions"
                    " ORDER BY scheduled_for, id OFFSET :k LIMIT 1"
                ),
                {"k": max(0, args.sent - 1)},
            ).one()
        keyset = "AND (e.scheduled_for, e.id) > (:at, :id)"
        variants = [
            ("before: no keyset, (state, scheduled_for) index", "", True),
            ("partial (scheduled_for, id) index, no keyset", "", False),
            ("now: partial index and keyset", keyset, False),
        ]
        for label, clause, drop in variants:
            with engine.begin() as connection:
                if drop:
                    connection.exec_driver_sql("DROP INDEX index_geneva_drive_step_executions_due")
                rows = connection.execute(
                    text("EXPLAIN (ANALYZE, BUFFERS) " + CLAIM.format(keyset=clause)),
                    {"at": last[0], "id": last[1]},
                ).fetchall()
                plan = "\n".join(row[0] for row in rows)
                took = re.search(r"Execution Time: ([\d.]+) ms", plan)
                buffers = re.search(r"Buffers: shared hit=(\d+)", plan)
                print(f"--- {label}: {took and took.group(1)} ms, {buffers and buffers.group(1)}")
                print(plan + "\n")
                connection.rollback()  # the DROP INDEX too
    finally:
        engine.dispose()
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        admin.dispose()


if __name__ == "__main__":
    main()
