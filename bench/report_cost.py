# ruff: noqa: RUF001  (the tables use en dashes and multiplication signs, as bench/report.py does)
"""bench/RESULTS.md's first section: CPU per step of the whole deployment, rendered
from the committed JSON of ``python -m bench.cost`` (bench/results/run/cost.json, and
cost_neighbour.json for the rounds beside a busy neighbour)."""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import g, read_result

HEADING = "Cost per step: CPU seconds of the whole deployment"


def _f(v: Any, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if isinstance(v, int | float) else "–"


def _ms(d: Any, key: str = "total") -> str:
    return _f(g(d, f"cpu_ms_per_step.{key}"))


def _idle(d: Any) -> str:
    idle = d.get("idle_cpu_ms_per_s") if isinstance(d, dict) else None
    return _f(sum(idle.values()), 1) if isinstance(idle, dict) and idle else "–"


def _spread(s: Any) -> str:
    if not isinstance(s, dict):
        return "– | –"
    return f"**{s['median']:.2f}** | {s['min']:.2f}–{s['max']:.2f}"


RATIOS = (
    ("ours_vs_dbos", "ours ÷ DBOS's cheaper mode that round", "≤ 0.5×"),
    ("ours_vs_dbos_queue", "ours ÷ DBOS queued", "–"),
    ("ours_vs_dbos_seq", "ours ÷ DBOS sequential in process", "–"),
    ("ours_vs_raw", "ours ÷ the raw floor (a hop's bare transactions)", "–"),
)


def _median_of(values: list[Any]) -> dict[str, Any] | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    if not numbers:
        return None
    return {"median": statistics.median(numbers), "min": min(numbers), "max": max(numbers),
            "n": len(numbers)}  # fmt: skip


def _rounds_block(data: dict[str, Any], title: str) -> list[str]:
    meta = data.get("meta", {})
    rounds = data.get("rounds", {})
    summary = data.get("summary", {})
    lines = [f"### {title}", ""]
    w = lines.append
    w(f"Command: `{meta.get('command', '?')}`, {meta.get('started', '?')} to "
      f"{meta.get('finished', '?')}; {len(rounds)} rounds of {meta.get('workflows', '?')} ten-step "
      f"workflows per side. `uptime` at the start: {meta.get('uptime_start', '?')}; at the end: "
      f"{meta.get('uptime_end', '?')}."
      + (f" Neighbour: `{' '.join(meta['neighbour_cmd'])}` for the whole run." if meta.get("neighbour_cmd") else "")
      + (f" {meta['note']}" if meta.get("note") else ""))  # fmt: skip
    w("")
    w("| CPU ms per step | median | spread (min–max) | target |")
    w("|---|---:|---:|---:|")
    for key, label in (
        ("ours_ms_per_step", "ours (whole deployment)"),
        ("dbos_queue_ms_per_step", "DBOS queued (its process + its backends)"),
        ("dbos_seq_ms_per_step", "DBOS sequential in process"),
        ("raw_ms_per_step", "raw floor (client + backend)"),
    ):
        w(f"| {label} | {_spread(summary.get(key))} | – |")
    for key, label, target in RATIOS:
        w(f"| {label} | {_spread(summary.get(key))} | {target} |")
    above = {
        label: _median_of([g(r, path) for r in rounds.values()])
        for label, path in (
            ("ours", "ours.cpu_ms_per_step_above_idle"),
            ("DBOS queued", "dbos.queue.cpu_ms_per_step_above_idle"),
            ("DBOS sequential", "dbos.seq.cpu_ms_per_step_above_idle"),
        )
    }
    for label, spread in above.items():
        if spread:
            w(f"| {label}, above what its processes burn idle for as long (the {spread['n']} "
              f"rounds that measured idle) | {_spread(spread)} | – |")  # fmt: skip
    w("")
    w(
        "Per round (ms of CPU per step; ours split into the Celery worker and its children / the "
        "dispatcher / Redis / PostgreSQL backends / the client creating the workflows; DBOS into "
        "its process / its backends; the raw floor into client / backend):"
    )
    w("")
    w(
        "| round | order | load 1m | ours total | ours split | ours steps/s | ours idle CPU ms/s | "
        "DBOS queued | DBOS queued split | DBOS seq | DBOS seq split | DBOS idle CPU ms/s | raw | "
        "raw split | ours ÷ DBOS |"
    )
    w("|---:|---|---:|---:|---|---:|---:|---:|---|---:|---|---:|---:|---|---:|")
    for k, r in sorted(rounds.items(), key=lambda kv: int(kv[0])):
        ours, dq, ds, raw = (
            r.get("ours", {}),
            g(r, "dbos.queue", {}),
            g(r, "dbos.seq", {}),
            r.get("raw", {}),
        )
        loads = [x for side in (ours, dq, ds, raw) for x in (side.get("load_1m") or [])]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"
        w(f"| {k} | {' → '.join(r.get('order', []))} | {load} | **{_ms(ours)}** | "
          f"{' / '.join(_ms(ours, p) for p in ('worker', 'dispatcher', 'redis', 'postgres', 'client_create'))} | "
          f"{_f(ours.get('steps_per_s'), 0)} | {_idle(ours)} | {_ms(dq)} | {_ms(dq, 'dbos_process')} / {_ms(dq, 'postgres')} | "
          f"{_ms(ds)} | {_ms(ds, 'dbos_process')} / {_ms(ds, 'postgres')} | {_idle(r.get('dbos', {}))} | {_ms(raw)} | "
          f"{_ms(raw, 'client')} / {_ms(raw, 'postgres')} | {_f(g(r, 'ratios.ours_vs_dbos'))}× |")  # fmt: skip
    w("")
    return lines


def section() -> list[str]:
    quiet = read_result("cost")
    busy = read_result("cost_neighbour")
    if not quiet and not busy:
        return []
    lines = [f"## {HEADING}", ""]
    w = lines.append
    w("CPU seconds per step, from /proc (utime+stime), of every process a deployment runs for "
      "B3's workload (ten-step workflows of no-op steps on PostgreSQL, created in one commit): "
      "ours is the Celery worker (`prefork -c 2`, inline successors on) with its children, the "
      "dispatcher (`geneva-drive dispatcher`), a private `redis-server`, the PostgreSQL backends "
      "of the run's own database and the client while it creates the workflows; DBOS is its one "
      "process and its database's backends; the raw floor is a hop's two transactions issued "
      "bare through SQLAlchemy Core (`peer_raw_floor.pg_hop_pairs`) by one client. "
      "`python -m bench.cost` (bench/cost.py) measures it in paired rounds, alternating the "
      "order; the figure is the median of the rounds with its spread.")  # fmt: skip
    w("")
    w("**Read each round's load beside it** (2 vCPU, at times shared with other work). CPU per "
      "step is much steadier than throughput under load, but not immune to it: a busy machine "
      "costs more CPU per step too (caches, context switches, idle polling that finds nothing), "
      "so compare sides within a round, not across runs.")  # fmt: skip
    w("")
    if quiet:
        lines += _rounds_block(quiet, "Without a neighbour (the machine's own load only)")
    if busy:
        lines += _rounds_block(
            busy, "Beside a fixed CPU-bound neighbour (one busy process pinned to one core)"
        )
    return lines
