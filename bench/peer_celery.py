"""Peer: raw Celery 5 + Redis, no-op tasks (the transport floor of B2/B3 and B5).

Adapted from the Celery script of the original peer benchmark scripts (2026-11-29): one worker
``prefork -c 2`` on Redis db 14; single task enqueue→start (unloaded), 3-task chains one at a time
(unloaded chain hop = end of task k → start of task k+1), and a burst of chains (tasks/s).

    .venv/bin/python -m bench.peer_celery [--quick]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import (
    POLL,
    PY,
    REDIS_URL,
    ROOT,
    Deadline,
    child_env,
    env_info,
    stop_process,
    summarize_ms,
    write_result,
)


class Collector:
    def __init__(self, directory: str) -> None:
        self.d = directory
        self.offsets: dict[str, int] = {}
        self.rows: list[tuple[str, int, int, float, float, float]] = []

    def poll(self) -> None:
        for path in glob.glob(os.path.join(self.d, "*.log")):
            off = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read()
            cut = data.rfind(b"\n") + 1
            if cut:
                for line in data[:cut].decode().splitlines():
                    tag, idx, step, te, ts, tend = line.split()
                    self.rows.append((tag, int(idx), int(step), float(te), float(ts), float(tend)))
                self.offsets[path] = off + cut

    def count(self, tag: str) -> int:
        return sum(1 for r in self.rows if r[0] == tag)

    def wait(self, tag: str, n: int, timeout: float, sleep: float = 0.0005) -> bool:
        dl = Deadline(timeout)
        while not dl.expired():
            self.poll()
            if self.count(tag) >= n:
                return True
            time.sleep(sleep)
        return False

    def by_tag(self, tag: str) -> list[tuple[str, int, int, float, float, float]]:
        return [r for r in self.rows if r[0] == tag]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--name",
        default="celery_peer",
        help="result name (default celery_peer, the one bench/report.py renders; give another "
        "for side runs so they do not replace the last full run's figures)",
    )
    args = parser.parse_args()
    n_single = 50 if args.quick else 200
    n_chain1 = 20 if args.quick else 50
    n_chains = 100 if args.quick else 500
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    res: dict[str, Any] = {
        "env": env_info(),
        "broker": REDIS_URL,
        "worker": "prefork -c 2, prefetch 1, acks_late (as engine/celery.py)",
    }
    with tempfile.TemporaryDirectory(prefix="celery-peer-") as tdir:
        os.environ["BENCH_BROKER_URL"] = REDIS_URL
        os.environ["BENCH_TIMING_DIR"] = tdir
        from celery import chain

        from bench.peer_celery_app import noop

        env = child_env()
        log = open(os.path.join(tdir, "worker.out"), "w")  # noqa: SIM115
        worker = subprocess.Popen(
            [PY, "-m", "celery", "-A", "bench.peer_celery_app", "worker", "-P", "prefork", "-c", "2",
             "-l", "WARNING", "-Q", "bench_raw", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        col = Collector(tdir)
        try:
            for i in range(20):
                noop.apply_async(("warm", i, 0, time.time()))
            res["warm"] = col.wait("warm", 20, 90)
            for i in range(n_single):
                noop.apply_async(("single", i, 0, time.time()))
                if not col.wait("single", i + 1, 30, sleep=POLL):
                    break
            res["single_enqueue_to_start"] = summarize_ms(
                [r[4] - r[3] for r in col.by_tag("single")]
            )
            for i in range(n_chain1):
                chain(noop.si("chain1", i, 0, time.time()), noop.si("chain1", i, 1, 0.0),
                      noop.si("chain1", i, 2, 0.0)).apply_async()  # fmt: skip
                if not col.wait("chain1", 3 * (i + 1), 30, sleep=POLL):
                    break
            c1: dict[int, dict[int, Any]] = {}
            for r in col.by_tag("chain1"):
                c1.setdefault(r[1], {})[r[2]] = r
            hops = [
                s[k][4] - s[k - 1][5] for s in c1.values() for k in (1, 2) if k in s and k - 1 in s
            ]
            res["chain_hop_unloaded"] = summarize_ms(hops)
            t0 = time.time()
            for i in range(n_chains):
                chain(noop.si("chain", i, 0, time.time()), noop.si("chain", i, 1, 0.0),
                      noop.si("chain", i, 2, 0.0)).apply_async()  # fmt: skip
            ok = col.wait("chain", 3 * n_chains, 240, sleep=0.005)
            rows = col.by_tag("chain")
            t_last = max(r[5] for r in rows) if rows else time.time()
            burst: dict[int, dict[int, Any]] = {}
            for r in rows:
                burst.setdefault(r[1], {})[r[2]] = r
            bh = [
                s[k][4] - s[k - 1][5]
                for s in burst.values()
                for k in (1, 2)
                if k in s and k - 1 in s
            ]
            res["chain_burst"] = {"chains": n_chains, "complete": ok, "tasks": len(rows),
                                  "wall_s": round(t_last - t0, 3),
                                  "tasks_per_s": round(len(rows) / (t_last - t0), 1),
                                  "hop_under_load": summarize_ms(bh)}  # fmt: skip
        finally:
            stop_process(worker)
    print(f"[celery peer] {res}", file=sys.stderr)
    write_result(args.name, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
