"""Shared helpers of the bench scripts: percentiles, deadlines, JSON results, services.

Standard library only at import time: the peers' venv (bench/.venv-peers, without geneva_drive
or SQLAlchemy) imports it too, as ``python -m bench.peer_dbos`` from the repository root.

Percentile and summary helpers are adapted from the helpers of the original peer benchmark scripts
(2026-11-29).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
#: The JSON results of the last full run, which RESULTS.md and README's table are rendered from:
#: tracked, so that ``python -m bench.run --render`` reproduces both from a clean clone. Commit
#: them together with the RESULTS.md they produced.
OUT = Path(os.environ.get("GENEVA_BENCH_OUT", BENCH / "results" / "run"))
PG_URL = os.environ.get("GENEVA_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
#: Redis database index reserved for the bench (others use 0); flushed only by us.
REDIS_URL = os.environ.get("GENEVA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PY = sys.executable
# How often a harness polls for "the step ran" while measuring one-at-a-time latencies. The
# latency itself comes from timestamps the worker writes, so polling faster buys no accuracy;
# it only takes a core from the worker and the database on a 2-core machine (at 0.2-0.5 ms the
# poller kept a core busy and inflated every hop it was measuring). Same for every peer.
POLL = 0.01


#: After seeding workflows with SQL: the per-(class, state) counts the engine keeps as it writes
#: (geneva_drive.counts), recounted from the rows, so the pages show (and pay for) what they
#: would in production.
# What geneva_drive.counts.rebuild() writes, in one statement for seeds that bypass the ORM:
# ready and performing share the "ongoing" row (engine/counts.py).
RECOUNT_SQL = (
    "INSERT INTO geneva_drive_workflow_counts (type, state, shard, count) "
    "SELECT type, s, 0, COUNT(*) FROM (SELECT type, CASE WHEN state IN ('ready', 'performing') "
    "THEN 'ongoing' ELSE state END AS s FROM geneva_drive_workflows) AS w GROUP BY type, s"
)


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a bench subprocess (a scenario, a Celery worker): this process's, with
    the repository root on ``PYTHONPATH`` so that ``bench.*`` modules import in it wherever it
    starts (``celery -A bench.peer_celery_app``, ``GENEVA_WORKFLOW_MODULES=bench.flows``)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def g(d: Any, path: str, default: Any = None) -> Any:
    """``d["a"]["b"]`` for ``path`` ``"a.b"``; ``default`` where a key is missing."""
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def dbos_best(d: dict[str, Any]) -> float | None:
    """DBOS's best mode on PostgreSQL in steps/s (B3's peer): its queue burst, or its 3- or
    10-step workflows run sequentially in process, whichever was fastest."""
    wf10 = g(d, "seq_wf10.workflows_per_s")
    candidates = [
        g(d, "queue_burst.steps_per_s"),
        g(d, "seq_wf3.steps_per_s"),
        wf10 * 10 if isinstance(wf10, int | float) else None,
    ]
    values = [float(v) for v in candidates if isinstance(v, int | float)]
    return max(values) if values else None


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[k]


def summarize_ms(values_s: list[float]) -> dict[str, Any]:
    """Seconds -> ms statistics."""
    if not values_s:
        return {"n": 0}
    ms = [v * 1000.0 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(pct(ms, 90) or 0.0, 3),
        "p99_ms": round(pct(ms, 99) or 0.0, 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.t_end = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() > self.t_end


def write_result(name: str, payload: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    print(f"[{name}] wrote {path}", file=sys.stderr)
    return path


def read_result(name: str) -> dict[str, Any] | None:
    path = OUT / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def stop_process(p: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """SIGTERM (warm shutdown), then SIGKILL of its own process group after ``timeout``."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)


def pg_schema_url(schema: str, url: str = PG_URL) -> str:
    """The PostgreSQL URL with ``search_path`` set to ``schema`` (libpq ``options``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def reset_pg_schema(schema: str, url: str = PG_URL) -> None:
    from sqlalchemy import create_engine, text

    assert "127.0.0.1" in url or "localhost" in url, "loopback only"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
    engine.dispose()


def drop_pg_schema(schema: str, url: str = PG_URL) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


MARIADB_URL = os.environ.get("GENEVA_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")


def reset_mariadb_database(name: str, url: str = MARIADB_URL) -> str:
    """A new empty MariaDB database ``name`` next to ``url``'s (dropped first); its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine.url import make_url

    assert "127.0.0.1" in url or "localhost" in url, "loopback only"
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        c.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"))
    engine.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def drop_mariadb_database(name: str, url: str = MARIADB_URL) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    engine.dispose()


def env_info() -> dict[str, Any]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": os.getloadavg(),
    }
    for pkg in ("celery", "kombu", "SQLAlchemy", "redis", "psycopg"):
        try:
            info[pkg.lower()] = version(pkg)
        except PackageNotFoundError:
            pass
    return info


# --- CPU accounting from /proc ----------------------------------------------------------------
# CPU per step is read from the kernel's own counters rather than from wall time: on a shared
# machine a step's wall time moves with the neighbours' load, its CPU seconds far less.

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, *, reaped: bool = True) -> float | None:
    """utime+stime of ``pid`` (plus cutime+cstime: its children that exited and were reaped,
    when ``reaped``), in seconds; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    fields = data[data.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLK_TCK


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every live descendant (a Celery worker and its prefork children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out


def tree_cpu(pid: int) -> dict[int, float]:
    """{pid: CPU seconds} over a process tree, each including its reaped children: a child
    that exits between two readings moves into its parent's cutime, so the sum over the tree
    at the end minus the sum at the start counts it exactly once."""
    out = {}
    for p in tree_pids(pid):
        value = cpu_seconds(p)
        if value is not None:
            out[p] = value
    return out


def start_neighbour(core: int | None = None) -> subprocess.Popen[bytes]:
    """The fixed CPU-bound neighbour: one busy Python process (``while True: pass``),
    pinned with ``taskset`` to one core (the last one by default) when taskset exists. It
    stands for another tenant's busy process on a shared machine; stop it with
    :func:`stop_neighbour` (by its PID)."""
    import shutil

    cmd = [sys.executable, "-c", "while True: pass"]
    if shutil.which("taskset"):
        last = (os.cpu_count() or 1) - 1
        cmd = ["taskset", "-c", str(last if core is None else core), *cmd]
    # taskset execs the command, so the PID is the busy process's own.
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL)


def stop_neighbour(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


class PgBackends:
    """The CPU of the PostgreSQL backends serving one database, from /proc: the run's own
    database (created for it), so other users of the shared server are not counted.

    ``start()`` takes each live backend's CPU as its baseline; ``sample()`` (call it now and
    then during the run, and at the end) adds backends that connected meanwhile, from zero,
    and keeps the last reading of each, so a backend that disconnects before the end still
    counts up to its last sample. The query runs on a connection to another database, so the
    measurement does not measure itself. Needs psycopg (both venvs have it).
    """

    def __init__(self, dbname: str, admin_conninfo: str) -> None:
        import psycopg

        self.dbname = dbname
        self.conn = psycopg.connect(admin_conninfo, autocommit=True)
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def _pids(self) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,)
        ).fetchall()
        return [int(r[0]) for r in rows]

    def start(self) -> None:
        self.base, self.last = {}, {}
        for pid in self._pids():
            value = cpu_seconds(pid, reaped=False)
            if value is not None:
                self.base[pid] = self.last[pid] = value

    def sample(self) -> None:
        for pid in self._pids():
            value = cpu_seconds(pid, reaped=False)
            if value is not None:
                self.base.setdefault(pid, 0.0)
                self.last[pid] = value

    def seconds(self) -> float:
        return sum(self.last[p] - self.base[p] for p in self.last)

    def close(self) -> None:
        self.conn.close()


#: Set to 1 in a bench process (and so in the workers it starts) to replace the per-(class,
#: state) counts upsert by a no-op, as before migration 0010: the check that the count
#: maintenance costs B3 and B10 nothing beyond the spread pairs rounds with and without it
#: (bench/probe_ab.py; bench/NOTES.md, "The scale targets, measured on one code").
COUNTS_OFF_ENV = "GENEVA_BENCH_COUNTS_OFF"


def apply_counts_off() -> bool:
    """Stub the counts upsert in this process when :data:`COUNTS_OFF_ENV` is 1; whether it did."""
    if os.environ.get(COUNTS_OFF_ENV) != "1":
        return False
    from geneva_drive import counts

    counts.add_to_counts = lambda *a, **k: None  # type: ignore[assignment]
    return True


#: Set to 1 to have Celery worker processes ask the broker "are others waiting?" at every
#: yield point, as before the answer was kept for 50 ms (paired rounds, bench/probe_ab.py).
WAITING_UNCACHED_ENV = "GENEVA_BENCH_WAITING_UNCACHED"


def apply_waiting_uncached() -> bool:
    """Ask the broker at every yield point in this process when :data:`WAITING_UNCACHED_ENV`
    is 1; whether it did."""
    if os.environ.get(WAITING_UNCACHED_ENV) != "1":
        return False
    from geneva_drive import celery as geneva_celery

    geneva_celery._messages_waiting = geneva_celery._ask_broker
    return True


#: Set to 1 to have a process write a step's successor INSERT as a statement of its own after
#: its predecessor's outcome, as before the two were folded into one on PostgreSQL (paired
#: rounds, bench/probe_ab.py).
INSERT_UNFOLDED_ENV = "GENEVA_BENCH_INSERT_UNFOLDED"


def apply_insert_unfolded() -> bool:
    """Unfold the successor's INSERT in this process when :data:`INSERT_UNFOLDED_ENV` is 1;
    whether it did."""
    if os.environ.get(INSERT_UNFOLDED_ENV) != "1":
        return False
    from geneva_drive.dialects.postgresql import PostgreSQLDialect

    PostgreSQLDialect.combined_insert = False
    return True


#: A comma-separated list of index names that bench.cost drops after creating its schema: what
#: maintaining them costs a step (lever 5 of bench/NOTES.md's cost-per-step list, paired rounds
#: through bench/probe_ab.py).
DROP_INDEXES_ENV = "GENEVA_BENCH_DROP_INDEXES"


def apply_drop_indexes(engine: Any) -> list[str]:
    """Drop the indexes :data:`DROP_INDEXES_ENV` names (if any) on ``engine``; their names."""
    names = [n.strip() for n in os.environ.get(DROP_INDEXES_ENV, "").split(",") if n.strip()]
    if names:
        from sqlalchemy import text

        with engine.begin() as connection:
            for name in names:
                connection.execute(text(f'DROP INDEX "{name}"'))
    return names
