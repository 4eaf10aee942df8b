"""Two versions of the engine's code, their CPU per step interleaved in short chunks.

``probe_engine_interleaved`` compares settings inside one process; a change to the code itself
needs two processes, one per version. Here two children run the executor as a Celery worker
does (``execute(id, budget=...)``: inline successors, no broker) on ten-step no-op workflows on
PostgreSQL, each on its own database, and the parent hands them chunks of ``--chunk`` workflows
in turn (the order alternating), so both versions see the same minutes of this machine, whose
speed swings by tens of percent between minutes (bench/NOTES.md). Per chunk it reads each
child's CPU from /proc and that of its database's backends; the verdict is the median over
chunks of B's CPU per step against A's chunk next to it, with the spread.

A version is a directory holding the engine's sources (the ``engine/`` directory of a checkout
or of ``git worktree add /tmp/base <commit>``): the child imports ``geneva_drive`` from it.
Settings apply to both sides through the environment (``GENEVA_*``).

    git worktree add /tmp/base HEAD~1
    .venv/bin/python -m bench.probe_engine_ab --a /tmp/base/engine --b engine [--chunks 20] \
        [--chunk 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PgBackends, cpu_seconds, env_info
from bench.cost import ADMIN_URL, _drop_database, _libpq
from bench.probe_engine_interleaved import chain_runner, figures, spread

ROOT = Path(__file__).resolve().parent.parent


def serve(dbname: str) -> int:
    """The child: a line "N" runs N workflows and answers "done"; EOF ends it."""
    import geneva_drive
    from geneva_drive import db

    workflows = chain_runner(dbname)  # a new database of that name
    workflows(5)  # warm: every statement compiled, every mapper configured
    print(f"ready {Path(geneva_drive.__file__).parent}", flush=True)
    for line in sys.stdin:
        workflows(int(line))
        print("done", flush=True)
    db.get_engine().dispose()
    return 0


class Side:
    def __init__(self, name: str, tree: Path, dbname: str) -> None:
        self.name, self.dbname = name, dbname
        # The child imports geneva_drive from ``tree`` (a directory named geneva_drive that
        # points at it, first on the path), bench from this checkout.
        self.shim = Path(tempfile.mkdtemp(prefix=f"probe-ab-{name}-"))
        (self.shim / "geneva_drive").symlink_to(tree.resolve(), target_is_directory=True)
        env = dict(os.environ, PYTHONPATH=f"{self.shim}{os.pathsep}{ROOT}")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.probe_engine_ab", "--serve", dbname],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=self.shim,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().strip()
        if not ready.startswith("ready "):
            raise SystemExit(f"side {name} did not start (see its errors above)")
        self.imported = ready.removeprefix("ready ")
        self.backends = PgBackends(dbname, _libpq(ADMIN_URL))

    def chunk(self, n: int) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.backends.start()
        before = cpu_seconds(self.proc.pid, reaped=False) or 0.0
        t0 = time.perf_counter()
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "done":
            raise SystemExit(f"side {self.name} failed (see its errors above)")
        wall = time.perf_counter() - t0
        client = (cpu_seconds(self.proc.pid, reaped=False) or 0.0) - before
        self.backends.sample()
        steps = 10 * n
        return {
            "client_ms": client * 1000 / steps,
            "postgres_ms": self.backends.seconds() * 1000 / steps,
            "wall_ms": wall * 1000 / steps,
        }

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.backends.close()
        _drop_database(self.dbname)
        (self.shim / "geneva_drive").unlink()
        self.shim.rmdir()


def run(a: Path, b: Path, chunks: int, chunk: int) -> dict[str, Any]:
    sides = [Side("a", a, "geneva_probe_ab_a"), Side("b", b, "geneva_probe_ab_b")]
    per: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    try:
        for k in range(chunks):
            for side in sides if k % 2 == 0 else list(reversed(sides)):
                per[side.name].append(side.chunk(chunk))
    finally:
        for side in sides:
            side.close()
    total = {n: [r["client_ms"] + r["postgres_ms"] for r in rows] for n, rows in per.items()}
    return {
        "a": {"tree": str(a), "imported": sides[0].imported, **figures(per["a"])},
        "b": {"tree": str(b), "imported": sides[1].imported, **figures(per["b"])},
        "ratio_b_to_a": spread([y / x for x, y in zip(total["a"], total["b"], strict=True)]),
        "client_ratio_b_to_a": spread(
            [y["client_ms"] / x["client_ms"] for x, y in zip(per["a"], per["b"], strict=True)]
        ),
        "chunks": chunks,
        "chunk_workflows": chunk,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", metavar="DATABASE", help=argparse.SUPPRESS)
    parser.add_argument("--a", type=Path, help="the baseline's engine sources")
    parser.add_argument("--b", type=Path, default=ROOT / "engine", help="the version measured")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=10, help="workflows per chunk")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if args.a is None:
        parser.error("--a (the baseline's engine directory) is required")
    for tree in (args.a, args.b):
        if not (tree / "executor.py").is_file():
            parser.error(f"{tree} holds no engine sources (no executor.py)")
    result = {"env": env_info(), **run(args.a, args.b, args.chunks, args.chunk)}
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
