"""Paired A/B rounds of one bench command under two environments.

A change's effect on a shared 2-core machine is only readable from rounds that alternate the
two variants minutes apart (a verdict is the median of paired rounds, with its
spread). This runs ``--cmd`` once per variant per round, A first in odd rounds and B first in
even ones, each writing its JSON to the ``{json}`` placeholder, and reports for every
``--key`` (a dotted path into that JSON) each variant's median and spread and the median of
the per-round ratios B ÷ A.

What the per-(class, state) counts cost the hot path::

    .venv/bin/python -m bench.probe_ab --rounds 6 --label counts-b3 \\
        --b-env GENEVA_BENCH_COUNTS_OFF=1 --a-name counts --b-name "no counts" \\
        --cmd ".venv/bin/python -m bench.cost --side ours --n 100 --json {json}" \\
        --key cpu_ms_per_step.total --key steps_per_s --json /tmp/ab.json

A setting's effect on B3's CPU per step::

    .venv/bin/python -m bench.probe_ab --rounds 6 --label yield \\
        --a-env GENEVA_INLINE_SUCCESSOR_YIELD_AFTER=3 --b-env GENEVA_INLINE_SUCCESSOR_YIELD_AFTER=10 \\
        --cmd ".venv/bin/python -m bench.cost --side ours --n 100 --json {json}" \\
        --key cpu_ms_per_step.total --key steps_per_s
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, child_env, g


def _env(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"bench.probe_ab: {pair!r} is not NAME=VALUE")
        out[name] = value
    return out


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def run(
    cmd: str, variants: dict[str, dict[str, str]], rounds: int, keys: list[str]
) -> dict[str, Any]:
    names = list(variants)
    # What each side really ran with: a name one variant sets and the other does not is
    # inherited from this process by the other (an exported value would apply to both).
    named = sorted({name for env in variants.values() for name in env})
    effective = {
        side: {name: child_env(**env).get(name) for name in named} for side, env in variants.items()
    }
    result: dict[str, Any] = {
        "command": cmd,
        "variants": variants,
        "effective_env": effective,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="geneva-ab-") as tmp:
        for k in range(1, rounds + 1):
            order = names if k % 2 else names[::-1]
            rnd: dict[str, Any] = {"order": order}
            for name in order:
                path = Path(tmp) / f"r{k}_{names.index(name)}.json"
                argv = [part.replace("{json}", str(path)) for part in shlex.split(cmd)]
                load = round(os.getloadavg()[0], 2)
                proc = subprocess.run(
                    argv, cwd=ROOT, env=child_env(**variants[name]), capture_output=True,
                    text=True, timeout=1800,
                )  # fmt: skip
                if proc.returncode != 0:
                    raise SystemExit(
                        f"bench.probe_ab: round {k} {name} exited {proc.returncode}:\n"
                        + proc.stderr[-2000:]
                    )
                data = json.loads(path.read_text())
                missing = [key for key in keys if g(data, key) is None]
                if missing:
                    raise SystemExit(f"bench.probe_ab: {', '.join(missing)} not in {cmd}'s JSON")
                rnd[name] = {key: g(data, key) for key in keys}
                rnd[name]["load_1m"] = load
                print(f"round {k} {name}: {rnd[name]}", file=sys.stderr, flush=True)
            result["rounds"].append(rnd)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    a, b = names
    summary: dict[str, Any] = {}
    for key in keys:
        va = [r[a][key] for r in result["rounds"] if isinstance(r[a][key], int | float)]
        vb = [r[b][key] for r in result["rounds"] if isinstance(r[b][key], int | float)]
        ratios = [
            r[b][key] / r[a][key]
            for r in result["rounds"]
            if isinstance(r[a][key], int | float) and isinstance(r[b][key], int | float)
            and r[a][key]
        ]  # fmt: skip
        summary[key] = {a: _spread(va), b: _spread(vb), f"{b} / {a}": _spread(ratios)}
    result["summary"] = summary
    return result


def markdown(result: dict[str, Any]) -> str:
    a, b = list(result["variants"])
    lines = [
        f"| figure | {a}: median (min-max) | {b}: median (min-max) | {b} ÷ {a} per round: "
        "median (min-max) |",
        "|---|---:|---:|---:|",
    ]

    def cell(s: dict[str, float] | None) -> str:
        return "-" if s is None else f"{s['median']:g} ({s['min']:g}-{s['max']:g})"

    for key, s in result["summary"].items():
        lines.append(f"| `{key}` | {cell(s[a])} | {cell(s[b])} | {cell(s[f'{b} / {a}'])} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cmd", required=True, help="the command; {json} is where it writes")
    parser.add_argument("--key", action="append", required=True, help="dotted path in the JSON")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--a-name", default="A")
    parser.add_argument("--b-name", default="B")
    parser.add_argument("--a-env", action="append", default=[], help="NAME=VALUE for A")
    parser.add_argument("--b-env", action="append", default=[], help="NAME=VALUE for B")
    parser.add_argument("--label", default="ab")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.a_name == args.b_name:
        raise SystemExit("bench.probe_ab: --a-name and --b-name must differ")
    if "{json}" not in args.cmd:
        raise SystemExit("bench.probe_ab: --cmd must write its figures to {json}")
    variants = {args.a_name: _env(args.a_env), args.b_name: _env(args.b_env)}
    result = run(args.cmd, variants, args.rounds, args.key)
    result["label"] = args.label
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
