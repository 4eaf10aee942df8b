"""The engine's own CPU per step on PostgreSQL, variants interleaved in short chunks.

This machine's speed swings by tens of percent between minutes (bench/NOTES.md), more than the
few percent one change to the hot path moves. Here one process runs the engine's executor as a
Celery worker does (``execute(id, budget=...)``: inline successors, no broker), on ten-step
no-op workflows, and alternates the variants every ``--chunk`` workflows, so each variant sees
the same minutes. Per chunk it reads this process's CPU (``time.process_time``) and the CPU of
the database's backends (from /proc); the verdict is the median over chunks of each variant
against the chunk of the first variant next to it. What it leaves out: Celery, Redis and the
dispatcher (bench/cost.py measures the whole deployment).

Variants (``--variants``, a comma list):

* ``unfolded`` - the successor's INSERT as a statement of its own (before the fold);
* ``default`` - as shipped;
* ``start`` - ``settings.inline_successor_start_with_outcome`` on.

    .venv/bin/python -m bench.probe_engine_interleaved [--chunks 20] [--chunk 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.common import PgBackends, env_info
from bench.cost import ADMIN_URL, _database_url, _drop_database, _libpq

VARIANTS = ("unfolded", "default", "start")


def _apply(variant: str) -> None:
    from geneva_drive.config import settings
    from geneva_drive.dialects.postgresql import PostgreSQLDialect

    PostgreSQLDialect.combined_insert = variant != "unfolded"
    settings.inline_successor_start_with_outcome = variant == "start"


def chain_runner(dbname: str) -> Callable[[int], None]:
    """Configure the engine on a new database ``dbname``; the function that runs N ten-step
    no-op workflows there as a worker does (inline successors, no broker)."""
    from geneva_drive import db, executor, inline
    from geneva_drive.models import Base
    from geneva_drive.transport import RecordingTransport, set_transport
    from geneva_drive.workflow import Workflow

    class ProbeChain(Workflow):
        may_proceed_without_hero = True

    for index in range(10):
        ProbeChain.add_step(f"s{index}", lambda self: None)

    engine = db.configure(_database_url(dbname))
    Base.metadata.create_all(engine)
    transport = RecordingTransport()
    set_transport(transport)

    def workflows(n: int) -> None:
        for _ in range(n):
            transport.messages.clear()
            with db.transaction() as session:
                ProbeChain.create(session=session)
            first = transport.messages[0].execution_id
            executor.execute(first, budget=inline.Budget(max_seconds=60, max_steps=100))

    return workflows


def run(variants: list[str], chunks: int, chunk: int) -> dict[str, Any]:
    from geneva_drive import db

    dbname = "geneva_probe_interleaved"
    workflows = chain_runner(dbname)
    backends = PgBackends(dbname, _libpq(ADMIN_URL))

    per: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        for variant in variants:  # warm every variant's statements once
            _apply(variant)
            workflows(3)
        for k in range(chunks):
            order = variants if k % 2 == 0 else list(reversed(variants))
            for variant in order:
                _apply(variant)
                backends.start()
                c0, t0 = time.process_time(), time.perf_counter()
                workflows(chunk)
                client, wall = time.process_time() - c0, time.perf_counter() - t0
                backends.sample()
                steps = 10 * chunk
                per[variant].append(
                    {
                        "client_ms": client * 1000 / steps,
                        "postgres_ms": backends.seconds() * 1000 / steps,
                        "wall_ms": wall * 1000 / steps,
                    }
                )
    finally:
        backends.close()
        db.get_engine().dispose()
        _drop_database(dbname)
    base = variants[0]
    out: dict[str, Any] = {"variants": {}, "chunks": chunks, "chunk_workflows": chunk}
    for variant in variants:
        rows = per[variant]
        total = [r["client_ms"] + r["postgres_ms"] for r in rows]
        ratio = [
            t / (b["client_ms"] + b["postgres_ms"]) for t, b in zip(total, per[base], strict=True)
        ]
        out["variants"][variant] = {**figures(rows), f"ratio_to_{base}": spread(ratio)}
    return out


def figures(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Each chunk's client, backend and wall ms per step, as medians with their spreads."""
    return {
        "cpu_ms_per_step": spread([r["client_ms"] + r["postgres_ms"] for r in rows]),
        "client_ms_per_step": spread([r["client_ms"] for r in rows]),
        "postgres_ms_per_step": spread([r["postgres_ms"] for r in rows]),
        "wall_ms_per_step": spread([r["wall_ms"] for r in rows]),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=10, help="workflows per chunk")
    parser.add_argument("--json")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    result = {"env": env_info(), **run(variants, args.chunks, args.chunk)}
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
