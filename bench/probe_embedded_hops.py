"""Step-to-step hop latency of the embedded default (what ``geneva-drive up`` runs).

Runs an :class:`geneva_drive.embedded.EmbeddedWorker` in this process on a fresh SQLite file (or
``GENEVA_DATABASE_URL``), starts ``--workflows`` workflows of ``--steps`` empty steps each, and
reports ``started_at(next) - completed_at(previous)`` percentiles::

    .venv/bin/python -m bench.probe_embedded_hops --workflows 5 --steps 40
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time

from sqlalchemy import select

from geneva_drive import Workflow, db, transport
from geneva_drive.embedded import EmbeddedWorker
from geneva_drive.models import Base, StepExecution


class BenchHopsWorkflow(Workflow):
    may_proceed_without_hero = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflows", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    for n in range(args.steps):
        BenchHopsWorkflow.add_step(f"s{n:03d}", lambda self: None)

    url = os.environ.get("GENEVA_DATABASE_URL")
    if not url:
        url = f"sqlite:///{tempfile.mkdtemp()}/hops.sqlite3"
    db.configure(url)
    Base.metadata.create_all(db.get_engine())
    worker = EmbeddedWorker(concurrency=args.concurrency)
    transport.set_transport(worker.transport)
    worker.start()
    ids = []
    for _ in range(args.workflows):
        with db.transaction() as session:
            wf = BenchHopsWorkflow.create(session=session, allow_multiple=True)
            session.flush()
            ids.append(wf.id)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with db.new_session() as session:
            states = set(session.scalars(select(Workflow.state).where(Workflow.id.in_(ids))))
        if states == {"finished"}:
            break
        time.sleep(0.1)
    worker.stop()
    gaps = []
    with db.new_session() as session:
        for workflow_id in ids:
            chain = list(
                session.scalars(
                    select(StepExecution)
                    .where(StepExecution.workflow_id == workflow_id)
                    .order_by(StepExecution.id)
                )
            )
            gaps += [
                (b.started_at - a.completed_at).total_seconds() * 1000
                for a, b in itertools.pairwise(chain)
            ]
    gaps.sort()
    print(
        f"{db.get_engine().dialect.name}: {len(gaps)} hops, p50 {statistics.median(gaps):.1f} ms, "
        f"p90 {gaps[int(len(gaps) * 0.9)]:.1f} ms, max {gaps[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
