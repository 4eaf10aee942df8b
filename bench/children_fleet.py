"""B12 (in-process part): a parent with N child workflows — statements, rows and time per child.

One step of the parent starts N children (``start_child`` in a loop, one transaction); each
child's one step then runs through the real executor in this process (messages recorded, not
sent: no broker), its end reaching the parent; the last end wakes the parent's join, which
runs. Reported: statements sent to the database per child started and per child run to its end
(the end's report to the parent included), rows written per child, the time to start them, and
the time from the last child's end to the parent's join starting.

``--fleet`` (PostgreSQL): the same on a real fleet — one ``celery worker`` (prefork,
``--concurrency`` processes) and the dispatcher (``geneva-drive dispatcher``) on a private
``redis-server`` (bench/cost.py's), in schema ``geneva_bench_b12`` (bench/engine_celery.py's
``Stack``). The bench process creates one ``FleetOrder`` (bench/flows.py), whose first step
starts N ``FleetLine`` children and whose second joins them, and only watches the step bodies'
timestamps. Reported: the fan-out step's body, and its start to the step's commit once the
after-commit hook has sent the N children's messages (all N created and sent), when the first and the last child ran, the time from the
last child's end to the join's body starting (from the body's end and from the execution's
``finished_at``), statements and transactions per child counted inside the worker
(bench/sql_count.py; the dispatcher's own apart), rows inserted/updated/deleted per child
(``pg_stat_user_tables``), and that every child ran and reported exactly once.

    .venv/bin/python -m bench.children_fleet --backend sqlite|postgres [--children 1000]
    .venv/bin/python -m bench.children_fleet --fleet [--children 10000 --concurrency 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from sqlalchemy import event, func, select

from bench.common import drop_pg_schema, env_info, pg_schema_url, reset_pg_schema, write_result
from geneva_drive import Workflow, db, executor, step
from geneva_drive.models import Base, Signal, StepExecution
from geneva_drive.transport import RecordingTransport, set_transport

SCHEMA = "geneva_bench_b12"
#: How many children the parent's step starts (set from --children).
FLEET = {"size": 1000}
JOIN_STARTED: list[float] = []


class BenchLine(Workflow):
    may_proceed_without_hero = True

    @step
    def ship(self) -> None:
        pass


class BenchOrder(Workflow):
    may_proceed_without_hero = True

    @step
    def fan_out(self) -> None:
        for _ in range(FLEET["size"]):
            self.start_child(BenchLine, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        JOIN_STARTED.append(time.perf_counter())


def _current(session: Any, workflow_id: int) -> int | None:
    return session.scalar(
        select(StepExecution.id)
        .where(StepExecution.workflow_id == workflow_id, StepExecution.state == "scheduled")
        .order_by(StepExecution.id)
        .limit(1)
    )


def run(url: str, size: int) -> dict[str, Any]:
    FLEET["size"] = size
    engine = db.configure(url)
    Base.metadata.create_all(engine)
    set_transport(RecordingTransport())
    counts = {"statements": 0}

    @event.listens_for(engine, "before_cursor_execute")
    def _count(*_args: object) -> None:
        counts["statements"] += 1

    with db.transaction() as session:
        parent_id = int(BenchOrder.create(session=session).id)
    with db.new_session() as session:
        first = _current(session, parent_id)
    assert first is not None
    counts["statements"] = 0
    started = time.perf_counter()
    executor.execute(first)  # fan_out: starts the children; the join parks
    start_seconds = time.perf_counter() - started
    start_statements = counts["statements"]

    with db.new_session() as session:
        children = list(
            session.execute(
                select(Workflow.id, StepExecution.id)
                .join(StepExecution, StepExecution.workflow_id == Workflow.id)
                .where(Workflow.parent_id == parent_id)
                .order_by(Workflow.id)
            )
        )
    assert len(children) == size
    counts["statements"] = 0
    ended = time.perf_counter()
    last_end = ended
    for _child_id, execution_id in children:
        executor.execute(int(execution_id))
        last_end = time.perf_counter()
    end_seconds = last_end - ended
    end_statements = counts["statements"]

    with db.new_session() as session:
        join = _current(session, parent_id)
    assert join is not None, "the last child's end did not wake the join"
    executor.execute(join)
    assert JOIN_STARTED, "the join did not run"
    with db.new_session() as session:
        state = session.scalar(select(Workflow.state).where(Workflow.id == parent_id))
        signals = session.scalar(
            select(func.count()).select_from(Signal).where(Signal.workflow_id == parent_id)
        )
        executions = session.scalar(select(func.count()).select_from(StepExecution))
    assert state == "finished"
    return {
        "children": size,
        "start_seconds": round(start_seconds, 3),
        "start_statements_per_child": round(start_statements / size, 2),
        "run_and_end_statements_per_child": round(end_statements / size, 2),
        "end_ms_per_child": round(1000 * end_seconds / size, 3),
        # The wake-up is committed with the last child's end; this is the executor picking the
        # parent's join up in this process (no broker): the engine's own part of that latency.
        "last_end_to_join_ms": round(1000 * (JOIN_STARTED[0] - last_end), 3),
        "rows_per_child": {
            "workflow": 1,
            "step_execution": round((executions - 2) / size, 2),
            "signal_child_ended": round(signals / size, 2),
        },
    }


def _pg_tuples(schema: str) -> dict[str, dict[str, int]]:
    """Rows inserted, updated (of which HOT) and deleted per table of ``schema`` so far."""
    from sqlalchemy import create_engine, text

    from bench.common import PG_URL

    engine = create_engine(PG_URL)
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
                "FROM pg_stat_user_tables WHERE schemaname = :s"
            ),
            {"s": schema},
        ).all()
    engine.dispose()
    return {r[0]: {"ins": r[1], "upd": r[2], "hot_upd": r[3], "del": r[4]} for r in rows}


def _sql_file(directory: str, pid: int) -> dict[str, int]:
    from bench import sql_count

    path = os.path.join(directory, f"{pid}.sql")
    if not os.path.exists(path):
        return dict.fromkeys(sql_count.FIELDS, 0)
    with open(path) as fh:
        values = [int(v) for v in fh.readline().split()]
    return dict(zip(sql_count.FIELDS, values, strict=True))


def run_fleet(size: int, concurrency: int, timeout: float) -> dict[str, Any]:
    """B12 on a Celery fleet (PostgreSQL): see the module's docstring."""
    import subprocess
    from pathlib import Path

    from bench import sql_count
    from bench.common import PY, child_env, children_of, stop_process
    from bench.cost import _private_redis
    from bench.engine_celery import Stack

    os.environ["GENEVA_B12_CHILDREN"] = str(size)
    out: dict[str, Any] = {"children": size, "concurrency": concurrency}
    with tempfile.TemporaryDirectory(prefix="geneva-b12-") as workdir:
        redis_proc, redis_url = _private_redis(workdir)
        stack = Stack("postgres", workdir, schema=SCHEMA, redis_url=redis_url)
        dispatcher: subprocess.Popen[bytes] | None = None
        try:
            # Set after Stack imported bench.flows here, so that only the fleet counts.
            counts_dir = os.path.join(workdir, "sql")
            os.makedirs(counts_dir)
            os.environ["GENEVA_BENCH_SQL_COUNT"] = counts_dir
            stack.start_worker(concurrency)
            log = open(os.path.join(workdir, "dispatcher.log"), "a")  # noqa: SIM115
            dispatcher = subprocess.Popen(
                [str(Path(PY).parent / "geneva-drive"), "dispatcher"],
                cwd=str(Path(__file__).resolve().parent.parent),
                env=child_env(GENEVA_WORKFLOW_MODULES="bench.flows"),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            out["warm"] = stack.warm_up()
            # An idle PostgreSQL 15 backend reports its table statistics within 10 s: wait, so
            # that the warm-up's rows are not counted as the run's.
            time.sleep(11.0)
            assert stack.worker is not None
            worker_pids = {stack.worker.pid, *children_of(stack.worker.pid)}
            fleet0 = sql_count.read(counts_dir)
            dispatch0 = _sql_file(counts_dir, dispatcher.pid)
            tuples0 = _pg_tuples(SCHEMA)
            load0 = os.getloadavg()
            [(parent_id, t_create)] = stack.create("FleetOrder")
            t = stack.timings
            join_key = ("FleetOrder", parent_id, 1)
            deadline = time.monotonic() + timeout
            next_report = time.monotonic() + 30
            while join_key not in t.rows:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the join did not run within {timeout} s")
                time.sleep(0.5)  # seldom: the machine has two cores
                t.poll()
                if time.monotonic() > next_report:
                    next_report += 30
                    ran = sum(1 for k in t.rows if k[0] == "FleetLine")
                    print(f"[b12] {ran} of {size} children ran", file=sys.stderr)
            load1 = os.getloadavg()
            time.sleep(1.0)
            t.poll()
            # Stopped before reading: a backend's last table statistics reach
            # pg_stat_user_tables when it exits.
            stack.stop_worker()
            stop_process(dispatcher)
            time.sleep(1.0)
            fleet1 = sql_count.read(counts_dir)
            dispatch1 = _sql_file(counts_dir, dispatcher.pid)
            tuples1 = _pg_tuples(SCHEMA)
            out.update(_fleet_figures(t.rows, parent_id, t_create, size))
            out["worker_processes"] = len(worker_pids)
            out["load_1m"] = [round(load0[0], 2), round(load1[0], 2)]
            dispatch = {k: dispatch1[k] - dispatch0[k] for k in sql_count.FIELDS}
            worker = {k: fleet1[k] - fleet0[k] - dispatch[k] for k in sql_count.FIELDS}
            out["worker_per_child"] = {k: round(v / size, 2) for k, v in worker.items()}
            out["dispatcher_total"] = dispatch
            out["rows_per_child"] = {
                table: {
                    k: round((v - tuples0.get(table, {}).get(k, 0)) / size, 2)
                    for k, v in counts.items()
                }
                for table, counts in sorted(tuples1.items())
                if counts != tuples0.get(table)
            }
        finally:
            if dispatcher is not None:
                stop_process(dispatcher)
            stack.close()
            stop_process(redis_proc)
    return out


def _fleet_figures(
    rows: dict[tuple[str, int, int], list[tuple[float, float, int]]],
    parent_id: int,
    t_create: float,
    size: int,
) -> dict[str, Any]:
    from datetime import UTC

    with db.new_session() as session:
        children = [
            int(c)
            for c in session.scalars(
                select(Workflow.id).where(Workflow.parent_id == parent_id).order_by(Workflow.id)
            )
        ]
        last_finished = session.scalar(
            select(func.max(StepExecution.finished_at)).where(
                StepExecution.workflow_id.in_(
                    select(Workflow.id).where(Workflow.parent_id == parent_id)
                )
            )
        )
        signals = session.scalar(
            select(func.count()).select_from(Signal).where(Signal.workflow_id == parent_id)
        )
        state = session.scalar(select(Workflow.state).where(Workflow.id == parent_id))
    fan_start, fan_end, _ = rows[("FleetOrder", parent_id, 0)][0]
    _start, committed, _ = rows[("FleetOrder", parent_id, 2)][0]
    join_start = rows[("FleetOrder", parent_id, 1)][0][0]
    runs = [rows.get(("FleetLine", c, 0), []) for c in children]
    starts = [r[0][0] for r in runs if r]
    ends = [r[0][1] for r in runs if r]
    assert last_finished is not None
    finished_ts = last_finished.replace(tzinfo=UTC).timestamp()
    return {
        "children_found": len(children),
        "children_ran": sum(1 for r in runs if r),
        "children_ran_twice": sum(1 for r in runs if len(r) > 1),
        "joins_ran": len(rows[("FleetOrder", parent_id, 1)]),
        "child_ended_signals": signals,
        "parent_state": state,
        "create_to_fan_out_start_s": round(fan_start - t_create, 3),
        "fan_out_body_s": round(fan_end - fan_start, 3),
        "fan_out_start_to_committed_and_sent_s": round(committed - fan_start, 3),
        "fan_out_start_to_first_child_s": round(min(starts) - fan_start, 3),
        "fan_out_start_to_last_child_start_s": round(max(starts) - fan_start, 3),
        "children_per_s": round(size / (max(ends) - min(starts)), 1),
        "last_child_body_end_to_join_ms": round(1000 * (join_start - max(ends)), 1),
        "last_child_finished_at_to_join_ms": round(1000 * (join_start - finished_ts), 1),
        "wall_s": round(join_start - t_create, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--fleet", action="store_true", help="on a Celery fleet (PostgreSQL)")
    parser.add_argument("--concurrency", type=int, default=4, help="--fleet: worker processes")
    parser.add_argument("--timeout", type=float, default=3600, help="--fleet: seconds")
    parser.add_argument("--name", default=None, help="--fleet: result name")
    args = parser.parse_args()
    if args.fleet:
        fleet = run_fleet(args.children, args.concurrency, args.timeout)
        fleet_payload = {"backend": "postgres", "env": env_info(), **fleet}
        write_result(args.name or "b12_children_fleet_postgres", fleet_payload)
        print(fleet_payload)
        return 0
    if args.backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            result = run(f"sqlite:///{os.path.join(directory, 'b12.sqlite3')}", args.children)
    else:
        reset_pg_schema(SCHEMA)
        try:
            result = run(pg_schema_url(SCHEMA), args.children)
        finally:
            db.get_engine().dispose()
            drop_pg_schema(SCHEMA)
    payload = {"backend": args.backend, "env": env_info(), **result}
    write_result(f"b12_children_{args.backend}", payload)
    print(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
