"""The benchmark figures are reproducible from the repository: ``python -m bench.run --render``
renders bench/RESULTS.md and README's performance table byte for byte from the committed JSON
(bench/results/run/), and refuses, writing nothing, when that JSON is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import report

pytestmark = pytest.mark.sqlite_pass  # no database: the SQLite pass runs it once

ROOT = Path(__file__).resolve().parents[1]


def test_results_md_is_what_the_committed_json_renders() -> None:
    assert report.render() == (ROOT / "bench" / "RESULTS.md").read_text()


def test_readmes_table_is_what_the_committed_json_renders() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(report.README_START)
    end = readme.index(report.README_END) + len(report.README_END)
    assert readme[start:end] == report.readme_table()


def test_render_refuses_without_the_runs_json_and_writes_nothing(tmp_path: Path) -> None:
    before = {name: (ROOT / name).read_bytes() for name in ("README.md", "bench/RESULTS.md")}
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--render"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "GENEVA_BENCH_OUT": str(tmp_path / "empty")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "run_meta.json is missing" in done.stderr
    assert "git checkout -- bench/results/run" in done.stderr
    assert {name: (ROOT / name).read_bytes() for name in before} == before
    assert not (tmp_path / "empty").exists()
