"""Does the hot path pay for the layering cleanup? B1 and B3 of two checkouts, paired rounds.

The cleanup (one state writer, import-linter layers, validators once, enums) was meant to cost
the hot path nothing. This measures it: the same B1 (in process, SQLite) and B3 (``hops``:
a real Celery worker, PostgreSQL + Redis) scenarios of each checkout, each with its own venv
and its own bench scripts, alternating which checkout goes first in each round, so that a
change of the machine's load between minutes falls on both sides. A verdict comes from the
median of the rounds' ratios, shown with its spread.

    .venv/bin/python -m bench.probe_cleanup_cost --variant before=/work/wt/base17 \\
        --variant after=/work/wt/tip17 --variant now-off=.:GENEVA_INLINE_SUCCESSORS=false \\
        --rounds 5

A variant is ``label=checkout[:ENV=value,...]`` (``GENEVA_INLINE_SUCCESSORS=false`` also
passes ``--inline off`` to engine_celery.py, which sets the worker's setting from that flag); its checkout needs ``scripts/bootstrap`` run
(``.venv``). B1 is ``engine_inprocess_sqlite --workflows 300 --repeats 1`` (``b1_engine_sqlite.py``
before the cleanup's renames) and B3 ``engine_celery --backend postgres --scenarios hops``, both as
that checkout has them (their output keys have not changed since the first benchmark run). Prints a JSON summary; ``--json`` writes it.
Self-contained on purpose (standard library only): it runs the scripts of other checkouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: (scenario, the metric read from its result, True when higher is better)
METRICS = [
    ("b1", "steps_per_s", True),
    ("b1", "marginal_ms_per_step", False),
    ("b3", "hops.burst.steps_per_s", True),
    ("b3", "hops.unloaded_hop.p50_ms", False),
]


def parse_variant(text: str) -> tuple[str, Path, dict[str, str]]:
    label, _, rest = text.partition("=")
    checkout, _, env_text = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_text.split(",") if item)
    return label, Path(checkout).resolve(), env


def script(checkout: Path, old: str, new: str) -> list[str]:
    """How that checkout runs a bench script: ``-m bench.<new>`` once bench/ is a package
    (the cleanup's names), else the file under its name of the time."""
    if (checkout / "bench" / "__init__.py").exists():
        return ["-m", f"bench.{new}"]
    return [f"bench/{old}.py"]


def run(checkout: Path, env: dict[str, str], scenario: str, tag: str) -> dict[str, Any]:
    python = str(checkout / ".venv" / "bin" / "python")
    out = checkout / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    if scenario == "b1":
        target = out / f"cleanup_{tag}_b1.json"
        cmd = [python, *script(checkout, "b1_engine_sqlite", "engine_inprocess_sqlite"),
               "--workflows", "300", "--repeats", "1", "--json", str(target)]  # fmt: skip
    else:
        target = out / f"cleanup_{tag}_b3.json"
        cmd = [python, *script(checkout, "engine_celery", "engine_celery"), "--backend",
               "postgres", "--scenarios", "hops", "--name", f"cleanup_{tag}_b3"]  # fmt: skip
        if env.get("GENEVA_INLINE_SUCCESSORS") == "false":
            # engine_celery.py sets the worker's setting from its own flag (default on).
            cmd += ["--inline", "off"]
    full_env = {**os.environ, "PYTHONPATH": f"{checkout}:{checkout / 'bench'}", **env}
    done = subprocess.run(cmd, cwd=checkout, env=full_env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{cmd} in {checkout} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return dict(json.loads(target.read_text()))


def pick(result: dict[str, Any], dotted: str) -> float:
    value: Any = result
    for key in dotted.split("."):
        value = value[key]
    return float(value)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", required=True, help="label=checkout[:ENV=v]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    rounds: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        # Rotate the order each round so no checkout always runs first (or last).
        shift = (number - 1) % len(variants)
        ordered = variants[shift:] + variants[:shift]
        measured: dict[str, dict[str, float]] = {}
        for scenario in ("b1", "b3"):
            for label, checkout, env in ordered:
                result = run(checkout, env, scenario, label)
                for name, metric, _ in METRICS:
                    if name == scenario:
                        measured.setdefault(label, {})[f"{scenario}.{metric}"] = pick(
                            result, metric
                        )
        rounds.append({"round": number, "load_1m": os.getloadavg()[0], "values": measured})
        print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    baseline = variants[0][0]
    summary: dict[str, Any] = {
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "baseline": baseline,
        "rounds": rounds,
        "ratios": {},
    }
    for label, _, _ in variants[1:]:
        for scenario, metric, higher_better in METRICS:
            key = f"{scenario}.{metric}"
            # The ratio reads "how much better than the baseline": > 1 is faster.
            ratios = [
                (r["values"][label][key] / r["values"][baseline][key])
                if higher_better
                else (r["values"][baseline][key] / r["values"][label][key])
                for r in rounds
            ]
            summary["ratios"][f"{label} vs {baseline}: {key}"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
