"""Where a B3 step's CPU goes in our deployment, by sampling profiler and by counts.

The deployment of bench/cost.py (Celery worker ``prefork -c 2`` with inline successors, the
dispatcher, a private redis-server, PostgreSQL in its own database) runs ``--n`` ten-step
workflows while ``py-spy record --subprocesses --nonblocking`` samples the worker and its
children and, separately, the dispatcher; the worker counts its SQL statements and
transactions (bench/sql_count.py). The samples are grouped two ways:

* **by the code that runs** (the innermost frame): psycopg, SQLAlchemy's ORM, SQLAlchemy's
  Core/engine, the engine's own modules, Celery/kombu/billiard, redis-py, serialization
  (json/pickle/kombu's serializers), logging, the rest;
* **by the engine's part it serves** (the innermost ``geneva_drive`` frame on the stack, so
  the SQLAlchemy and driver time a module causes is charged to it): the executor's phases,
  persistence (ORM loading and Core writes), the state machine, instrumentation, scheduling,
  the inline successor, the Celery task wrapper; samples with no engine frame are Celery's own
  per-task work (or idle loops) in the worker.

    .venv/bin/python -m bench.profile_b3 [--n 200] [--rate 200] [--json out.json] [--wall]

Needs py-spy (``pip install py-spy`` into .venv; it is not a dependency of the project) and
permission to ptrace the worker (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import PY, child_env, env_info, stop_process
from bench.cost import start_fleet

PYSPY = str(Path(PY).parent / "py-spy")
#: Where the engine's modules live (the repository's engine/ directory, installed editable).
ENGINE_DIR = str(Path(__file__).resolve().parents[1] / "engine") + "/"

#: (label, predicate on the frame's file path), first match wins; for the innermost frame.
#: Leaf functions that wait on a socket or a pipe (a --wall profile's idle time).
WAITS = ("Connection.wait", "_epoll.poll", "SocketBuffer._read_from_socket", "Connection._recv",
         "select", "poll", "sleep")  # fmt: skip
LEAF_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("psycopg (driver)", ("/psycopg/", "/psycopg_binary/")),
    ("SQLAlchemy ORM", ("/sqlalchemy/orm/",)),
    ("SQLAlchemy Core/engine/pool", ("/sqlalchemy/",)),
    (
        "serialization (json, pickle, kombu serializers)",
        ("/json/", "pickle", "/kombu/serialization"),
    ),
    ("Celery, kombu, billiard, vine", ("/celery/", "/kombu/", "/billiard/", "/vine/", "/amqp/")),
    ("redis-py", ("/redis/",)),
    ("logging", ("/logging/",)),
    ("blinker (events)", ("/blinker/",)),
    ("geneva_drive (engine's own Python)", (ENGINE_DIR, "/geneva_drive/")),
    ("bench step bodies", ("/bench/",)),
]

#: The engine module (innermost geneva_drive frame) -> the part of the brief it belongs to.
PARTS = {
    "persistence.py": "ORM loading and writes (persistence.py)",
    "models.py": "ORM loading and writes (persistence.py)",
    "compiled.py": "hot statements on the driver's cursor (compiled.py)",
    "states.py": "state machine (states.py, transitions.py)",
    "transitions.py": "state machine (states.py, transitions.py)",
    "instrumentation.py": "events/instrumentation (instrumentation.py, metrics)",
    "metrics_facade.py": "events/instrumentation (instrumentation.py, metrics)",
    "prometheus.py": "events/instrumentation (instrumentation.py, metrics)",
    "statsd.py": "events/instrumentation (instrumentation.py, metrics)",
    "scheduling.py": "scheduling the successor (scheduling.py)",
    "inline.py": "inline successor claim (inline.py)",
    "transport.py": "publishing (transport.py)",
    "celery.py": "Celery task wrapper (celery.py)",
    "celery_client.py": "Celery task wrapper (celery.py)",
    "executor.py": "executor's own code (executor.py)",
    "db.py": "sessions and connections (db.py)",
    "workflow.py": "workflow/step definitions (workflow.py, steps.py, policies.py)",
    "steps.py": "workflow/step definitions (workflow.py, steps.py, policies.py)",
    "policies.py": "workflow/step definitions (workflow.py, steps.py, policies.py)",
    "logsafe.py": "logging (logsafe.py)",
    "serialization.py": "serialization (serialization.py)",
    "dispatch.py": "dispatcher (dispatch.py)",
}


def parse_frame(frame: str) -> tuple[str, str]:
    """py-spy's raw frame ``function (path:line)`` -> (function, path)."""
    if frame.endswith(")") and " (" in frame:
        func, rest = frame.rsplit(" (", 1)
        return func, rest[:-1].rsplit(":", 1)[0]
    return frame, ""


def classify(stack: list[tuple[str, str]]) -> tuple[str, str]:
    """(by code, by engine part) for one sample (frames root first)."""
    leaf_path = stack[-1][1] if stack else ""
    if stack and stack[-1][0] in WAITS:
        return "waiting (socket, pipe, poll)", "waiting (socket, pipe, poll)"
    leaf = next(
        (label for label, needles in LEAF_RULES if any(n in leaf_path for n in needles)), "other"
    )
    engine = [
        (func, path)
        for func, path in stack
        if path.startswith(ENGINE_DIR) or "/geneva_drive/" in path
    ]
    if not engine:
        if any("/celery/" in p or "/billiard/" in p or "/kombu/" in p for _, p in stack):
            return leaf, "Celery's own per-task work (no engine frame on the stack)"
        return leaf, "other (no engine frame)"
    func, path = engine[-1]
    module = os.path.basename(path)
    part = PARTS.get(module, f"other engine module ({module})")
    if module == "executor.py":
        part = f"executor.{func}"
    return leaf, part


def read_samples(path: Path) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    by_code: Counter[str] = Counter()
    by_part: Counter[str] = Counter()
    by_process: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        frames_text, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = frames_text.split(";")
        # With --subprocesses each stack starts with the process chain (parent first).
        procs = [f for f in frames if f.startswith("process ")]
        process = procs[-1] if procs else "main"
        stack = [parse_frame(f) for f in frames if not f.startswith(("process ", "thread "))]
        code, part = classify(stack)
        by_code[code] += count
        by_part[part] += count
        by_process[process.split(":")[0]] += count
        total += count
    return by_code, by_part, by_process, total


def share(counter: Counter[str], total: int) -> list[tuple[str, float]]:
    return [(k, round(100.0 * v / total, 1)) for k, v in counter.most_common()] if total else []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="ten-step workflows")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--wall",
        action="store_true",
        help="sample every thread whatever it does (where the time goes, waits included); by "
        "default only threads holding the GIL are sampled (where the CPU goes)",
    )
    parser.add_argument("--keep", default=None, help="a directory to copy py-spy's raw files to")
    args = parser.parse_args()
    if not Path(PYSPY).exists():
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    from bench.cost import _create, _database_url, _drop_database, _private_redis

    dbname = "geneva_cost_profile"
    result: dict[str, Any] = {"env": env_info(), "n": args.n, "rate": args.rate}
    with tempfile.TemporaryDirectory(prefix="geneva-profile-") as workdir:
        url = _database_url(dbname)
        redis_proc, redis_url = _private_redis(workdir)
        timings_dir, count_dir = os.path.join(workdir, "timings"), os.path.join(workdir, "sql")
        os.makedirs(timings_dir)
        os.makedirs(count_dir)
        os.environ.update(
            GENEVA_BROKER_URL=redis_url,
            GENEVA_DEFAULT_QUEUE="bench",
            GENEVA_DATABASE_URL=url,
            GENEVA_BENCH_TIMINGS=timings_dir,
            GENEVA_BENCH_SQL_COUNT=count_dir,
            GENEVA_WORKFLOW_MODULES="bench.flows",
        )
        from geneva_drive import db
        from geneva_drive.models import Base
        from geneva_drive.transport import set_transport

        engine = db.configure(url)
        Base.metadata.create_all(engine)
        set_transport(None)
        from bench import sql_count
        from bench.engine_celery import Timings

        env = child_env()
        worker, dispatcher = start_fleet(workdir, env)
        spies: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        try:
            timings = Timings(timings_dir)
            warm = _create(10)
            if not timings.wait_for([("ChainFlow", wf, 9) for wf in warm], 120, sleep=0.05):
                raise RuntimeError("warm-up workflows did not finish")
            time.sleep(1.0)
            # --gil: only samples of a thread running Python (or C under the GIL); a thread
            # waiting on a socket releases it. Without it py-spy's idle filter, which cannot
            # tell a blocked psycopg wait from work in --nonblocking mode, let waits dominate.
            gil = [] if args.wall else ["--gil"]
            for name, pid, extra in (
                ("worker", worker.pid, ["--subprocesses"]),
                ("dispatcher", dispatcher.pid, []),
            ):
                out = Path(workdir) / f"{name}.txt"
                spy = subprocess.Popen(
                    [PYSPY, "record", "--pid", str(pid), *extra, "--nonblocking", "--full-filenames", *gil, "--rate",
                     str(args.rate), "--format", "raw", "--output", str(out)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                )  # fmt: skip
                spies.append((name, spy, out))
            time.sleep(1.0)  # py-spy attaches
            counts0 = sql_count.read(count_dir)
            t0 = time.time()
            ids = _create(args.n)
            keys = [("ChainFlow", wf, 9) for wf in ids]
            if not timings.wait_for(keys, 600, sleep=0.1):
                raise RuntimeError("the profiled workflows did not finish")
            time.sleep(0.5)  # the last finalize commits after the last body
            wall = max(timings.rows[k][0][1] for k in keys) - t0
            counts1 = sql_count.read(count_dir)
            for _, spy, _ in spies:
                spy.send_signal(signal.SIGINT)
            for name, spy, out in spies:
                _, err = spy.communicate(timeout=60)
                if not out.exists():
                    raise RuntimeError(f"py-spy wrote nothing for {name}: {err.decode()[-500:]}")
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    shutil.copy(out, os.path.join(args.keep, out.name))
                by_code, by_part, by_process, total = read_samples(out)
                result[name] = {
                    "samples": total,
                    "by_code_pct": share(by_code, total),
                    "by_engine_part_pct": share(by_part, total),
                    "by_process_samples": dict(by_process),
                }
            steps = 10 * args.n
            result["steps"] = steps
            result["wall_s"] = round(wall, 3)
            result["per_step"] = {
                k: round((counts1[k] - counts0[k]) / steps, 3) for k in sql_count.FIELDS
            }
        finally:
            for _, spy, _ in spies:
                if spy.poll() is None:
                    spy.kill()
            stop_process(worker)
            stop_process(dispatcher)
            stop_process(redis_proc)
            db.get_engine().dispose()
            _drop_database(dbname)
    print(json.dumps(result, indent=2), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
