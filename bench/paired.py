# ruff: noqa: RUF001  (the tables use en dashes and multiplication signs, as bench/report.py does)
"""The targets that need a peer, as paired rounds (ours and the peer alternating).

The machine is shared (2 cores, other engineers' test suites): one run's ratio moves by 30 %
between minutes. Each round here runs our scenario and its peer back to back, in alternating
order (round 1 ours first, round 2 the peer first, ...), and computes the ratio of that
round; a target's verdict is the **median** of the rounds' ratios, shown with its spread
(min-max). Per round:

* ``bench.engine_celery --backend postgres --scenarios hops,chains,fresh`` with inline
  successors on, and again off (GENEVA_INLINE_SUCCESSORS), against
* ``bench.peer_dbos --backend postgres`` (B3 throughput: DBOS's best mode) and
  ``bench.peer_celery`` (the raw Celery hop);
* ``bench.engine_inprocess_sqlite`` against ``bench.peer_dbos --backend sqlite-wal
  --sync-normal`` (B1).

    .venv/bin/python -m bench.paired --rounds 5 [--quick]
    .venv/bin/python -m bench.paired --render      # re-render the section from bench/results/run/

Three more things, for the cost per step:

* the **cost** of a step as the first figure: each round also runs ``bench.cost --side ours``,
  ``bench.cost_dbos`` and ``bench.cost --side raw`` (CPU seconds per step of every process of
  the deployment, from /proc; see bench/cost.py), judged as ours ÷ DBOS's cheaper mode;
* ``--neighbour on|both``: a fixed CPU-bound neighbour (one ``python -c "while True: pass"``
  pinned to the last core with ``taskset``; bench/common.py ``start_neighbour``) runs beside
  every part (``on``), or each round runs its parts twice, without and then with it (``both``;
  even rounds with it first), so one run gives the quiet and the busy verdict side by side. The
  harness starts it and stops it by its PID around each pass;
* ``--parts`` (a comma list of the part names below) and ``--label`` (results under
  ``paired_<label>_…`` and a section of their own), so a partial run never overwrites the full
  section. For example, B3 and the inline hop quiet and with the neighbour:

    .venv/bin/python -m bench.paired --rounds 6 --parts engine_on,dbos_pg,celery \
        --neighbour both --label neighbour

Results: ``bench/results/run/paired_r<k>_<part>.json`` and ``bench/results/run/paired.json`` (the per-round
ratios); the "Paired rounds" section of bench/RESULTS.md is replaced in place, so the other
sections (the full run's, the soak's, a MariaDB section) are left as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import (
    BENCH,
    OUT,
    PY,
    ROOT,
    child_env,
    dbos_best,
    g,
    read_result,
    start_neighbour,
    stop_neighbour,
)

PEERS_PY = BENCH / ".venv-peers" / "bin" / "python"
HEADING = "## Paired rounds: inline successors against their peers"


#: The suffix of a part's results when it ran beside the neighbour (``--neighbour both``).
NB = "_nb"
PART_NAMES = ("cost_ours", "cost_dbos", "cost_raw", "engine_on", "dbos_pg", "celery", "engine_off",
              "b1", "dbos_sqlite")  # fmt: skip


def parts(
    round_no: int, quick: bool, prefix: str = "paired", suffix: str = ""
) -> list[tuple[str, list[str]]]:
    q = ["--quick"] if quick else []
    name = f"{prefix}_r{round_no}"
    cost_n = "50" if quick else "100"
    engine = [
        PY,
        "-m",
        "bench.engine_celery",
        "--backend",
        "postgres",
        "--scenarios",
        "hops,chains,fresh",
        *q,
    ]
    return [
        ("cost_ours", [PY, "-m", "bench.cost", "--side", "ours", "--n", cost_n,
                       "--json", str(OUT / f"{name}_cost_ours{suffix}.json")]),
        ("cost_dbos", [str(PEERS_PY), "-m", "bench.cost_dbos", "--n", cost_n,
                       "--json", str(OUT / f"{name}_cost_dbos{suffix}.json")]),
        ("cost_raw", [PY, "-m", "bench.cost", "--side", "raw", "--n", cost_n + "0",
                      "--json", str(OUT / f"{name}_cost_raw{suffix}.json")]),
        ("engine_on", [*engine, "--inline", "on", "--name", f"{name}_engine_on{suffix}"]),
        ("dbos_pg", [str(PEERS_PY), "-m", "bench.peer_dbos", "--backend", "postgres",
                     "--n", "100" if quick else "150", "--name", f"{name}_dbos_pg{suffix}"]),
        ("celery", [PY, "-m", "bench.peer_celery", *q, "--name", f"{name}_celery{suffix}"]),
        ("engine_off", [*engine, "--inline", "off", "--name", f"{name}_engine_off{suffix}"]),
        ("b1", [PY, "-m", "bench.engine_inprocess_sqlite", "--workflows", "150" if quick else "300",
                "--json", str(OUT / f"{name}_b1{suffix}.json")]),
        ("dbos_sqlite", [str(PEERS_PY), "-m", "bench.peer_dbos", "--backend", "sqlite-wal",
                         "--sync-normal", "--n", "150" if quick else "300",
                         "--name", f"{name}_dbos_sqlite{suffix}"]),
    ]  # fmt: skip


def order(round_no: int, steps: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """Odd rounds: ours first in each pair; even rounds: the peer first."""
    if round_no % 2 == 1:
        return steps
    by = dict(steps)
    names = ["cost_dbos", "cost_raw", "cost_ours", "dbos_pg", "engine_on", "engine_off", "celery",
             "dbos_sqlite", "b1"]  # fmt: skip
    return [(n, by[n]) for n in names if n in by]


def passes(round_no: int, neighbour: str) -> list[tuple[str, bool]]:
    """(results suffix, beside the neighbour?) for each pass of a round: ``both`` runs the
    round's parts quiet and then with the neighbour, in the other order in even rounds."""
    if neighbour == "both":
        quiet, busy = ("", False), (NB, True)
        return [quiet, busy] if round_no % 2 == 1 else [busy, quiet]
    return [("", neighbour == "on")]


def run_round(
    round_no: int,
    quick: bool,
    log: dict[str, Any],
    *,
    prefix: str = "paired",
    selected: tuple[str, ...] = PART_NAMES,
    neighbour: str = "off",
) -> None:
    env = child_env()
    for suffix, busy in passes(round_no, neighbour):
        steps = [s for s in parts(round_no, quick, prefix, suffix) if s[0] in selected]
        # Started and stopped (by its PID) around each pass, so that nothing outlives the run.
        nb = start_neighbour() if busy else None
        try:
            for part, cmd in order(round_no, steps):
                _run_part(round_no, part + suffix, cmd, env, log)
        finally:
            if nb is not None:
                stop_neighbour(nb)


def _run_part(
    round_no: int, part: str, cmd: list[str], env: dict[str, str], log: dict[str, Any]
) -> None:
    t0 = time.time()
    load0 = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    log.setdefault(str(round_no), {})[part] = {
        "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}",
        "elapsed_s": round(time.time() - t0, 1),
        "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "stderr_tail": "" if proc.returncode == 0 else proc.stderr[-800:],
    }
    print(f"round {round_no} {part}: {log[str(round_no)][part]['status']} "
          f"{log[str(round_no)][part]['elapsed_s']} s", file=sys.stderr, flush=True)  # fmt: skip


def div(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return float(a) / float(b)
    return None


def round_figures(k: int, prefix: str = "paired", suffix: str = "") -> dict[str, Any]:
    def result(part: str) -> dict[str, Any]:
        return read_result(f"{prefix}_r{k}_{part}{suffix}") or {}

    on, off, dpg, cel = (
        result("engine_on"),
        result("engine_off"),
        result("dbos_pg"),
        result("celery"),
    )
    b1, dsq = result("b1"), result("dbos_sqlite")
    cost_ours, cost_dbos, cost_raw = result("cost_ours"), result("cost_dbos"), result("cost_raw")
    dbos_modes = [g(cost_dbos, f"{m}.cpu_ms_per_step.total") for m in ("seq", "queue")]
    dbos_cost = min((v for v in dbos_modes if isinstance(v, int | float)), default=None)
    ours_cost = g(cost_ours, "cpu_ms_per_step.total")
    best = dbos_best(dpg)
    celery_hop = g(cel, "chain_hop_unloaded.p50_ms")
    loads = [(x.get("env") or {}).get("loadavg", [None])[0] for x in (cost_ours, on, b1)]
    return {
        "load_1m": next((v for v in loads if isinstance(v, int | float)), None),
        "cost_ours_ms": ours_cost,
        "cost_dbos_ms": dbos_cost,
        "cost_raw_ms": g(cost_raw, "cpu_ms_per_step.total"),
        "r_cost_vs_dbos": div(ours_cost, dbos_cost),
        "chains_on": g(on, "chains.steps_per_s"),
        "chains_off": g(off, "chains.steps_per_s"),
        "burst3_on": g(on, "hops.burst.steps_per_s"),
        "burst3_off": g(off, "hops.burst.steps_per_s"),
        "dbos_best": best,
        "hop_on": g(on, "hops.unloaded_hop.p50_ms"),
        "hop_off": g(off, "hops.unloaded_hop.p50_ms"),
        "celery_hop": celery_hop,
        "fresh_on_p50": g(on, "fresh.create_to_first_step.p50_ms"),
        "fresh_on_p99": g(on, "fresh.create_to_first_step.p99_ms"),
        "fresh_off_p50": g(off, "fresh.create_to_first_step.p50_ms"),
        "fresh_off_p99": g(off, "fresh.create_to_first_step.p99_ms"),
        "fresh_chains_on": g(on, "fresh.chains_completed_meanwhile"),
        "fresh_chains_off": g(off, "fresh.chains_completed_meanwhile"),
        "b1_ms": b1.get("ms_per_step"),
        "dbos_sqlite_ms": dsq.get("ms_per_step_wf3_total"),
        # The ratios each target is judged on.
        "r_b3_vs_dbos": div(g(on, "chains.steps_per_s"), best),
        "r_b3_off_vs_dbos": div(g(off, "chains.steps_per_s"), best),
        "r_hop_inline_vs_celery": div(g(on, "hops.unloaded_hop.p50_ms"), celery_hop),
        "r_hop_published_vs_celery": div(g(off, "hops.unloaded_hop.p50_ms"), celery_hop),
        "r_fresh_p99_on_vs_off": div(
            g(on, "fresh.create_to_first_step.p99_ms"), g(off, "fresh.create_to_first_step.p99_ms")
        ),
        "r_b1_vs_dbos": div(dsq.get("ms_per_step_wf3_total"), b1.get("ms_per_step")),
    }


TARGETS = [
    # key, label, target text, passes(median)
    ("r_cost_vs_dbos", "CPU per step of the whole deployment (B3's workload, PostgreSQL; bench/cost.py) ÷ DBOS's cheaper mode", "≤ 0.5×", lambda m: m <= 0.5),
    ("r_b3_vs_dbos", "B3 steps/s (10-step workflows, PostgreSQL) ÷ DBOS's best mode", "≥ 2×", lambda m: m >= 2.0),
    ("r_hop_inline_vs_celery", "B3 hop p50, inline successor ÷ raw Celery hop", "≤ 1.0×", lambda m: m <= 1.0),
    ("r_hop_published_vs_celery", "B3 hop p50, published (inline off) ÷ raw Celery hop", "≤ 3×", lambda m: m <= 3.0),
    ("r_fresh_p99_on_vs_off", "fresh workflow's first-step delay p99 while 50 ten-step chains run, inline on ÷ off", "≤ 2×", lambda m: m <= 2.0),
    ("r_b1_vs_dbos", "B1 rate (SQLite, in-process) ÷ DBOS's", "≥ 1.5×", lambda m: m >= 1.5),
]  # fmt: skip


def fmt(v: Any, digits: int = 2) -> str:
    if not isinstance(v, int | float):
        return "–"
    return f"{v:,.{digits}f}" if abs(v) < 1000 else f"{v:,.0f}"


def heading(label: str) -> str:
    return HEADING if not label else f"{HEADING} — {label}"


def render(meta: dict[str, Any]) -> str:
    label = meta.get("label", "")
    prefix = f"paired_{label}" if label else "paired"
    rounds = [int(k) for k in meta.get("rounds", [])]
    neighbour = meta.get("neighbour", "off")
    variants = (
        [("", "")]
        if neighbour != "both"
        else [("", "without the neighbour"), (NB, "with the neighbour")]
    )
    lines = [heading(label), ""]
    w = lines.append
    w(f"Command: `{meta.get('command', '?')}` — {meta.get('started', '?')} to "
      f"{meta.get('finished', '?')}; {len(rounds)} rounds, {'quick' if meta.get('quick') else 'full'} "
      f"scenario sizes. Machine load (`uptime`) at the start: {meta.get('uptime_start', '?')}; at the "
      f"end: {meta.get('uptime_end', '?')}."
      + "".join(f" Then `{a['command']}` from {a['started']} (`uptime`: {a['uptime_start']})."
                for a in meta.get("appended", []))
      + (f" {meta['note']}" if meta.get("note") else ""))  # fmt: skip
    w("")
    w("Each round runs our scenario and its peer back to back, in alternating order (odd rounds "
      "ours first, even rounds the peer first); a verdict is the median of the rounds' ratios, "
      "with their spread (min–max). Inline successors on is the engine's default; off is "
      "`GENEVA_INLINE_SUCCESSORS=false` (every successor published, as before inline successors).")  # fmt: skip
    if neighbour in ("on", "both"):
        w("")
        w("The neighbour is one busy process, `python -c \"while True: pass\"`, pinned "
          "to the last core with `taskset` (bench/common.py `start_neighbour`), started before "
          "and stopped by its PID after "
          + ("every part of every round." if neighbour == "on" else
             "the second pass of each round: each round runs its parts without and then with the "
             "neighbour (even rounds with the neighbour first)."))  # fmt: skip
    w("")
    summary: dict[str, Any] = {}
    dump: dict[str, Any] = {}
    for suffix, title in variants:
        figures = {k: round_figures(k, prefix, suffix) for k in rounds}
        dump[title or "rounds"] = figures
        if title:
            w(f"**{title[0].upper() + title[1:]}:**")
            w("")
        summary.update(_targets(lines, rounds, figures, suffix))
        _figures_table(lines, rounds, figures)
    # The analysis (why a target is or is not met) is kept beside the script, not generated.
    notes = BENCH / "paired_notes.md"
    if notes.exists() and not label:
        lines.append(notes.read_text().rstrip())
    (OUT / f"{prefix}.json").write_text(
        json.dumps({"meta": meta, "rounds": dump.get("rounds", dump), "summary": summary},
                   indent=2, default=str)
    )  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def _targets(
    lines: list[str], rounds: list[int], figures: dict[int, dict[str, Any]], suffix: str
) -> dict[str, Any]:
    w = lines.append
    w("| target | ratio per round | median | spread | target | verdict |")
    w("|---|---|---:|---:|---:|---|")
    summary: dict[str, Any] = {}
    for key, label, target, passes in TARGETS:
        values = [figures[k][key] for k in rounds if isinstance(figures[k][key], float)]
        if not values:
            w(f"| {label} | – | – | – | {target} | not measured |")
            continue
        median = statistics.median(values)
        summary[key + suffix] = {"median": median, "min": min(values), "max": max(values),
                                 "n": len(values)}  # fmt: skip
        per_round = ", ".join(f"{v:.2f}" for v in values)
        verdict = "**met**" if passes(median) else "**not met**"
        w(f"| {label} | {per_round} | **{median:.2f}×** | {min(values):.2f}–{max(values):.2f} | "
          f"{target} | {verdict} |")  # fmt: skip
    w("")
    return summary


def _figures_table(lines: list[str], rounds: list[int], figures: dict[int, dict[str, Any]]) -> None:
    w = lines.append
    w("The figures behind the ratios, per round:")
    w("")
    w(
        "| round | load 1m | CPU ms/step ours / DBOS / raw floor | B3 10-step steps/s on / off | "
        "3-step burst steps/s on / off | DBOS best steps/s | "
        "hop p50 ms inline / published | raw Celery hop p50 ms | fresh start p50 / p99 ms, on | "
        "fresh start p50 / p99 ms, off | chains finished meanwhile on / off | B1 ms/step ours / DBOS |"
    )
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in rounds:
        x = figures[k]
        w(f"| {k} | {fmt(x['load_1m'])} | {fmt(x['cost_ours_ms'])} / {fmt(x['cost_dbos_ms'])} / "
          f"{fmt(x['cost_raw_ms'])} | {fmt(x['chains_on'], 0)} / {fmt(x['chains_off'], 0)} | "
          f"{fmt(x['burst3_on'], 0)} / {fmt(x['burst3_off'], 0)} | {fmt(x['dbos_best'], 0)} | "
          f"{fmt(x['hop_on'])} / {fmt(x['hop_off'])} | {fmt(x['celery_hop'])} | "
          f"{fmt(x['fresh_on_p50'], 0)} / {fmt(x['fresh_on_p99'], 0)} | "
          f"{fmt(x['fresh_off_p50'], 0)} / {fmt(x['fresh_off_p99'], 0)} | "
          f"{fmt(x['fresh_chains_on'], 0)} / {fmt(x['fresh_chains_off'], 0)} | "
          f"{fmt(x['b1_ms'])} / {fmt(x['dbos_sqlite_ms'])} |")  # fmt: skip
    w("")


def readme_table(meta: dict[str, Any]) -> str:
    """README's performance table from the paired rounds (medians; bench/run.py replaces it
    with a full run's figures when one is made)."""
    from bench.report import README_END, README_START

    rounds = [int(k) for k in meta.get("rounds", [])]
    figures = [round_figures(k) for k in rounds]

    def med(key: str) -> float | None:
        values = [x[key] for x in figures if isinstance(x[key], int | float)]
        return statistics.median(values) if values else None

    rows = [
        ("B3 throughput, 10-step workflows, PostgreSQL + Redis, Celery prefork -c 2",
         f"{fmt(med('chains_on'), 0)} steps/s", f"{fmt(med('chains_off'), 0)} steps/s",
         f"DBOS best mode {fmt(med('dbos_best'), 0)} steps/s"),
        ("B3 hop p50 (end of a step → start of the next)", f"{fmt(med('hop_on'))} ms",
         f"{fmt(med('hop_off'))} ms", f"raw Celery chain hop {fmt(med('celery_hop'))} ms"),
        ("fresh workflow's first step while 50 ten-step workflows run, p50 / p99",
         f"{fmt(med('fresh_on_p50'), 0)} / {fmt(med('fresh_on_p99'), 0)} ms",
         f"{fmt(med('fresh_off_p50'), 0)} / {fmt(med('fresh_off_p99'), 0)} ms", "–"),
        ("B1 engine cost per step, SQLite in-process", f"{fmt(med('b1_ms'))} ms", "–",
         f"DBOS {fmt(med('dbos_sqlite_ms'))} ms"),
    ]  # fmt: skip
    lines = [
        README_START,
        f"Medians of {len(rounds)} paired rounds of `bench/paired.py` ({meta.get('started', '?')}; "
        f"1-minute load {meta.get('uptime_start', '?').split('load average:')[-1].strip()} at the start) "
        "on a 2-vCPU machine shared with other test runs, so absolute figures are several times "
        "the unloaded ones; the ratios, their spread and the full-run tables are in "
        "[bench/RESULTS.md](bench/RESULTS.md).",
        "",
        "| | GenevaDrive (inline successors on, the default) | inline successors off | peer, same rounds |",
        "|---|---:|---:|---:|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        README_END,
    ]  # fmt: skip
    return "\n".join(lines)


def write_readme(meta: dict[str, Any]) -> None:
    from bench.report import README_END, README_START

    path = ROOT / "README.md"
    text = path.read_text()
    if README_START not in text or README_END not in text:
        return
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(head + readme_table(meta) + tail)


def splice(section: str) -> None:
    """Replace (or add, after the title block) this section of bench/RESULTS.md (the one with
    exactly its heading: a labelled run's section leaves the others alone), then re-render the
    file so that every section stands where bench/report.py puts it (the cost first)."""
    from bench.report import render as render_results

    path = BENCH / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    parts = text.split("\n## ")
    head, rest = parts[0], parts[1:]
    title = section.split("\n", 1)[0]
    kept = [p for p in rest if ("## " + p).split("\n", 1)[0].rstrip() != title]
    body = section.rstrip("\n")[len("## ") :]
    out = (
        head.rstrip("\n") + "\n\n## " + body + "\n" + "".join(f"\n## {p.rstrip()}\n" for p in kept)
    )
    path.write_text(out)
    path.write_text(render_results())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--readme", action="store_true", help="also write README's table")
    parser.add_argument(
        "--append", action="store_true", help="add the rounds to the last run's (numbered on)"
    )
    parser.add_argument(
        "--neighbour",
        choices=["off", "on", "both"],
        default="off",
        help="a busy process pinned to one core beside every part (on), or a second pass of "
        "each round beside it (both)",
    )
    parser.add_argument("--parts", default=",".join(PART_NAMES), help="comma list of parts")
    parser.add_argument(
        "--label", default="", help="results as paired_<label>_… and a section of their own"
    )
    args = parser.parse_args()
    selected = tuple(p for p in args.parts.split(",") if p)
    unknown = sorted(set(selected) - set(PART_NAMES))
    if unknown:
        parser.error(
            f"--parts: unknown {', '.join(unknown)}; the parts are {', '.join(PART_NAMES)}"
        )
    if selected != PART_NAMES and not args.label and not args.render:
        parser.error("--parts without --label would replace the full run's section: add --label")
    prefix = f"paired_{args.label}" if args.label else "paired"
    OUT.mkdir(parents=True, exist_ok=True)
    meta_path = OUT / f"{prefix}_meta.json"
    if args.render:
        meta = json.loads(meta_path.read_text())
    else:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        command = ".venv/bin/python " + " ".join(["-m", "bench.paired", *sys.argv[1:]])
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        if args.append and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            meta.setdefault("appended", []).append({"command": command, "started": started,
                                                    "uptime_start": uptime})  # fmt: skip
        else:
            meta = {"command": command, "started": started, "uptime_start": uptime,
                    "quick": args.quick, "rounds": [], "log": {}, "label": args.label,
                    "neighbour": args.neighbour, "parts": list(selected)}  # fmt: skip
        first = max(meta["rounds"], default=0) + 1
        for k in range(first, first + args.rounds):
            run_round(k, args.quick, meta["log"], prefix=prefix, selected=selected,
                      neighbour=args.neighbour)  # fmt: skip
            meta["rounds"].append(k)
            meta_path.write_text(json.dumps(meta, indent=2))
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        meta["uptime_end"] = subprocess.run(
            ["uptime"], capture_output=True, text=True
        ).stdout.strip()
        meta_path.write_text(json.dumps(meta, indent=2))
    splice(render(meta))
    if args.readme and not args.label:
        write_readme(meta)
    print(f"wrote {BENCH / 'RESULTS.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
