"""Embedded default: what ``geneva-drive up`` runs — an in-process EmbeddedWorker (2 threads,
25 ms table poll, after-commit wake-ups) on SQLite, no broker.

Same workload and measures as B2 (bench/engine_celery.py): unloaded step-to-step hop over
sequential 3-step workflows, then a burst for steps/s. (bench/probe_embedded_hops.py measures the
hop from the rows' timestamps; this one from the step bodies, like the Celery runs.)

    .venv/bin/python -m bench.engine_embedded [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

from bench.common import POLL, env_info, summarize_ms, write_result
from bench.engine_celery import Timings, hops_of


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    res: dict[str, Any] = {"env": env_info(), "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="geneva-embedded-") as tmp:
        tdir = os.path.join(tmp, "timings")
        os.makedirs(tdir)
        os.environ["GENEVA_BENCH_TIMINGS"] = tdir
        from bench import flows
        from geneva_drive import db, transport
        from geneva_drive.embedded import EmbeddedWorker
        from geneva_drive.models import Base

        db.configure(f"sqlite:///{tmp}/embedded.sqlite3")
        Base.metadata.create_all(db.get_engine())
        worker = EmbeddedWorker(concurrency=2)
        transport.set_transport(worker.transport)
        worker.start()
        timings = Timings(tdir)

        def create(n: int) -> list[tuple[int, float]]:
            out = []
            for _ in range(n):
                with db.new_session() as session:
                    wf = flows.HopFlow.create(session=session, allow_multiple=True)
                    session.flush()
                    wf_id, t = wf.id, time.time()
                    session.commit()
                out.append((wf_id, t))
            return out

        try:
            warm = create(10)
            timings.wait_for([("HopFlow", wf, 2) for wf, _ in warm], 60, sleep=0.01)
            n_seq = 20 if args.quick else 50
            seq = []
            first = []
            for _ in range(n_seq):
                [(wf, t0)] = create(1)
                if not timings.wait_for([("HopFlow", wf, 2)], 30, sleep=POLL):
                    break
                seq.append(wf)
                first.append(timings.rows[("HopFlow", wf, 0)][0][0] - t0)
            res["unloaded_hop"] = summarize_ms(hops_of(timings, "HopFlow", seq, 3))
            res["unloaded_create_commit_to_first_step"] = summarize_ms(first)
            n_burst = 100 if args.quick else 500
            t0 = time.time()
            ids = [wf for wf, _ in create(n_burst)]
            ok = timings.wait_for([("HopFlow", wf, 2) for wf in ids], 240, sleep=0.01)
            ends = [timings.rows[("HopFlow", wf, k)][0][1] for wf in ids for k in range(3)
                    if ("HopFlow", wf, k) in timings.rows]  # fmt: skip
            wall = max(ends) - t0
            res["burst"] = {"workflows": n_burst, "all_completed": ok, "wall_s": round(wall, 3),
                            "steps_per_s": round(len(ends) / wall, 1),
                            "hop_under_load": summarize_ms(hops_of(timings, "HopFlow", ids, 3))}  # fmt: skip
        finally:
            worker.stop()
            transport.set_transport(None)
    print(f"[embedded] {res}", file=sys.stderr)
    write_result("engine_embedded", res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
