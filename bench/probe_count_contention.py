"""What keeping the per-(class, state) counts costs concurrent workers on PostgreSQL.

``--threads`` threads each create workflows of one class and run their ``--steps`` no-op steps
in-process (the executor, one transaction per phase, as a worker does), all moving workflows
of the same class between ``ready`` and ``performing`` at once: the worst case for count-row
contention. Rounds alternate with the counts kept (the default) and with the commit-time upsert
replaced by a no-op (as before migration 0010), so load drift hits both alike; prints steps/s
per round and the medians, and checks at the end of each counted round that the counts equal
the exact SQL count.

    .venv/bin/python -m bench.probe_count_contention --threads 4 --workflows 40 --rounds 3

Uses the schema ``--schema`` (default ``gd_count_probe``) of the shared test database; drops it
afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from bench.common import drop_pg_schema, pg_schema_url, reset_pg_schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--workflows", type=int, default=40, help="per thread and round")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="pairs of rounds (on, off)")
    parser.add_argument("--schema", default="gd_count_probe")
    args = parser.parse_args()

    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from geneva_drive import Workflow, counts, db
    from geneva_drive.models import Base
    from geneva_drive.testing import speedrun_workflow

    class CountProbeFlow(Workflow):
        may_proceed_without_hero = True  # no hero: the probe measures the engine's writes

    for index in range(args.steps):
        CountProbeFlow.add_step(f"s{index}", lambda self: None)
    probe_class: Any = CountProbeFlow

    # speedrun_workflow runs each step here; the messages a commit sends are only recorded.
    from geneva_drive.transport import RecordingTransport, set_transport

    set_transport(RecordingTransport())
    reset_pg_schema(args.schema)
    url = pg_schema_url(args.schema)
    engine = db.make_engine(url, pool_size=args.threads + 2)
    db.configure(engine=engine)
    Base.metadata.create_all(engine)
    real = counts.add_to_counts
    results: dict[str, list[float]] = {"counts kept": [], "counts off": []}

    def worker(errors: list[BaseException]) -> None:
        session = db.new_session()
        try:
            for _ in range(args.workflows):
                workflow = probe_class.create(session=session, allow_multiple=True)
                session.commit()
                speedrun_workflow(workflow)
        except BaseException as error:
            errors.append(error)
        finally:
            session.close()

    try:
        for _ in range(args.rounds):
            for mode in ("counts kept", "counts off"):
                counts.add_to_counts = real if mode == "counts kept" else (lambda *a, **k: None)  # type: ignore[assignment]
                errors: list[BaseException] = []
                threads = [
                    threading.Thread(target=worker, args=(errors,)) for _ in range(args.threads)
                ]
                started = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                seconds = time.perf_counter() - started
                if errors:
                    raise errors[0]
                steps = args.threads * args.workflows * args.steps
                results[mode].append(steps / seconds)
                print(f"{mode:12} {steps / seconds:8.1f} steps/s ({steps} steps, {seconds:.1f} s)")
                with Session(bind=engine) as session:
                    if mode == "counts kept":
                        exact = {
                            (t, s): n
                            for t, s, n in session.execute(
                                select(Workflow.type, Workflow.state, func.count()).group_by(
                                    Workflow.type, Workflow.state
                                )
                            )
                        }
                        counted = counts.read(session)
                        assert counted == exact, (counted, exact)
                        print(f"{'':12} counts equal the exact counts {exact}")
                    counts.rebuild(session)  # the "off" round left them behind
                    session.commit()
    finally:
        counts.add_to_counts = real  # type: ignore[assignment]
        engine.dispose()
        drop_pg_schema(args.schema)
    for mode, values in results.items():
        print(f"median {mode:12} {statistics.median(values):8.1f} steps/s")


if __name__ == "__main__":
    main()
