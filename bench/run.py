"""Every benchmark scenario for our engine and its peers in one run -> bench/RESULTS.md.

    .venv/bin/python -m bench.run            # full run (~10 min quiet, ~45 min on a loaded 2-core machine)
    .venv/bin/python -m bench.run --quick    # small N everywhere (a smoke run, not a verdict)
    .venv/bin/python -m bench.run --only b1,raw --quick
    .venv/bin/python -m bench.run --render   # re-render RESULTS.md and README's table from
                                             # bench/results/run/*.json (committed)

(from the repository root, like every bench script: ``python -m bench.<name>``).

Uses PostgreSQL (postgresql+psycopg://postgres@127.0.0.1:5432/test; schemas geneva_bench*,
dropped afterwards; B8/B9 share the kept ``bench_metrics`` schema seeded by
bench/engine_metrics.py) and Redis 127.0.0.1:6379 database 14 (GENEVA_BENCH_REDIS_URL; GENEVA_BENCH_SCHEMA
and GENEVA_BENCH_DBOS_DB rename the engine's schema and DBOS's database when another run shares
the services). DBOS runs in its own venv
(bench/.venv-peers, created here with ``pip install dbos``) to keep its dependencies out of
the project's. Each scenario is a subprocess with a time limit; a failing one is recorded
and the run goes on. Its JSON results land in bench/results/run/: commit them with the
RESULTS.md and README they rendered, so that ``--render`` reproduces both from a clean clone. Peers run in the same run, between our scenarios, so ratios compare
like with like on a machine whose load changes by the minute.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.common import BENCH, OUT, PY, ROOT, child_env, env_info, read_result

PEERS_VENV = BENCH / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"


def ensure_peers_venv() -> str | None:
    """Create bench/.venv-peers with dbos; None when usable, else the reason it is not."""
    if PEERS_PY.exists():
        ok = subprocess.run([str(PEERS_PY), "-c", "import dbos"], capture_output=True)
        if ok.returncode == 0:
            return None
    made = subprocess.run(
        [PY, "-m", "venv", "--clear", str(PEERS_VENV)], capture_output=True, text=True
    )
    if made.returncode != 0:
        return f"python -m venv failed: {made.stderr.strip()[-400:]}"
    pip = subprocess.run(
        [str(PEERS_PY), "-m", "pip", "install", "-q", "dbos", "psycopg[binary]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if pip.returncode != 0:
        return f"pip install dbos failed: {pip.stderr.strip()[-600:]}"
    return None


def steps(quick: bool) -> list[tuple[str, list[str], int]]:
    q = ["--quick"] if quick else []
    py = [PY]
    peers = [str(PEERS_PY)]
    return [
        ("raw", [*py, "-m", "bench.peer_raw_floor", "--n", "500" if quick else "1000"], 600),
        ("b1", [*py, "-m", "bench.engine_inprocess_sqlite", "--workflows", "100" if quick else "300",
                "--repeats", "1" if quick else "3", "--json", str(OUT / "b1.json")], 900),
        ("dbos-sqlite", [*peers, "-m", "bench.peer_dbos", "--backend", "sqlite-wal", "--sync-normal",
                         "--n", "100" if quick else "300"], 900),
        ("celery-peer", [*py, "-m", "bench.peer_celery", *q], 600),
        ("engine-sqlite", [*py, "-m", "bench.engine_celery", "--backend", "sqlite",
                           "--scenarios", "hops,signals", *q], 1200),
        ("dbos-pg", [*peers, "-m", "bench.peer_dbos", "--backend", "postgres",
                     "--n", "100" if quick else "150"], 900),
        ("engine-pg", [*py, "-m", "bench.engine_celery", "--backend", "postgres",
                       "--scenarios", "hops,signals,chains,fresh", *q], 1800),
        # B3 again with every successor published (inline successors off).
        ("engine-pg-noinline", [*py, "-m", "bench.engine_celery", "--backend", "postgres",
                                "--scenarios", "hops,chains,fresh", "--inline", "off",
                                "--name", "engine_celery_postgres_noinline", *q], 1800),
        ("engine-pg-trace", [*py, "-m", "bench.engine_celery", "--backend", "postgres", "--scenarios", "trace",
                             "--name", "engine_celery_postgres_trace", *q], 600),
        ("engine-pg-trace-noinline", [*py, "-m", "bench.engine_celery", "--backend", "postgres", "--scenarios", "trace", "--inline", "off",
                             "--name", "engine_celery_postgres_trace_noinline", *q], 600),
        # B3 again with the gem's fully synchronous commits (GENEVA_SYNCHRONOUS_START_COMMIT).
        ("engine-pg-sync", ["env", "GENEVA_SYNCHRONOUS_START_COMMIT=true", *py, "-m", "bench.engine_celery",
                            "--backend", "postgres", "--scenarios", "hops",
                            "--name", "engine_celery_postgres_sync", *q], 1200),
        ("b6", [*py, "-m", "bench.engine_celery", "--backend", "postgres", "--scenarios", "delayed",
                "--name", "b6_delayed", *q], 1800),
        ("embedded", [*py, "-m", "bench.engine_embedded", *q], 600),
        ("b7", [*py, "-m", "bench.engine_housekeeping", *q], 1800),
        ("b8", [*py, "-m", "bench.engine_dashboard", *q], 1800),
        ("b9", [*py, "-m", "bench.engine_metrics", "--runs", "5" if quick else "10"], 1800),
        ("b10", [*py, "-m", "bench.engine_inprocess_sqlite", "--workflows", "150", "--guard-rounds", "15",
                 "--json", str(OUT / "b10.json")], 600),
    ]  # fmt: skip


def run_steps(selected: list[tuple[str, list[str], int]], meta: dict[str, Any]) -> None:
    env = child_env()
    for name, cmd, limit in selected:
        if name.startswith("dbos") and meta.get("dbos_unavailable"):
            meta["steps"][name] = {"status": "not run", "reason": meta["dbos_unavailable"]}
            continue
        print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.time()
        load0 = os.getloadavg()[0]
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit
            )
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            tail = (proc.stderr or "")[-1500:]
        except subprocess.TimeoutExpired as exc:
            status = f"timeout after {limit} s"
            tail = (
                (exc.stderr or b"").decode(errors="replace")[-1500:]
                if isinstance(exc.stderr, bytes)
                else str(exc.stderr or "")[-1500:]
            )
        meta["steps"][name] = {
            "status": status,
            "elapsed_s": round(time.time() - t0, 1),
            "loadavg_1m_start": round(load0, 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
            "stderr_tail": tail if status != "ok" else "",
        }
        print(f"   {status} in {meta['steps'][name]['elapsed_s']} s", file=sys.stderr, flush=True)


def render_refusal() -> str | None:
    """Why ``--render`` must not run (None when it may): without the run's JSON every figure
    would render as a dash and overwrite RESULTS.md and README's table."""
    meta = OUT / "run_meta.json"
    if meta.exists():
        return None
    return (
        f"bench.run --render: {meta} is missing, so there are no results to render (every "
        "figure of bench/RESULTS.md and README's table would become a dash). The results of the "
        "last full run are committed in bench/results/run/: restore them with "
        "`git checkout -- bench/results/run`, or produce new ones with `python -m bench.run` "
        "(GENEVA_BENCH_OUT, when set, must name a directory holding a run's JSON). Nothing "
        "was written."
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--render", action="store_true", help="only re-render RESULTS.md")
    args = parser.parse_args()
    if args.render:
        refusal = render_refusal()
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.render:
        command = " ".join(["-m", "bench.run", *sys.argv[1:]])
        meta: dict[str, Any] = {
            "command": f".venv/bin/python {command}",
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "env": env_info(),
            "quick": args.quick,
            "steps": {},
        }
        reason = ensure_peers_venv()
        if reason:
            meta["dbos_unavailable"] = reason
        selected = steps(args.quick)
        if args.only:
            wanted = set(args.only.split(","))
            selected = [s for s in selected if s[0] in wanted]
            previous = read_result("run_meta") or {}
            meta["steps"] = previous.get("steps", {})
        run_steps(selected, meta)
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        if args.only:  # an addendum to the last full run: keep that run's command and times
            previous = read_result("run_meta") or {}
            addendum = {k: meta[k] for k in ("command", "started", "finished")}
            for key in ("command", "started", "finished", "env", "quick", "note"):
                if key in previous:
                    meta[key] = previous[key]
            meta["addenda"] = [*previous.get("addenda", []), addendum]
        if any(name == "b9" for name, _, _ in selected):
            metrics = BENCH / "results" / "bench_metrics.json"
            if metrics.exists():
                (OUT / "b9_bench_metrics.json").write_text(metrics.read_text())
        (OUT / "run_meta.json").write_text(json.dumps(meta, indent=2, default=str))
    from bench.report import render, write_readme_table

    (BENCH / "RESULTS.md").write_text(render())
    write_readme_table()
    print(f"wrote {BENCH / 'RESULTS.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
