"""The cost-per-step measuring tools (bench/RESULTS.md, "Cost per step"): CPU of a process tree from
/proc (children that exit count once, through their parent's cutime), the neighbour the paired
harness starts and stops by PID, and a labelled paired section that leaves the full run's section
alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import common, paired

pytestmark = [
    pytest.mark.sqlite_pass,  # no database: the SQLite pass runs it once
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc"),
]

# A parent that starts a child burning ~0.3 s of CPU (by its own process clock, not the wall
# clock: slow on a busy machine, never wrong), waits for it (reaping it), then sleeps until
# killed, so the tree is read with the child already gone.
PARENT = """
import subprocess, sys, time
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"
subprocess.run([sys.executable, "-c", burn], check=True)
print("reaped", flush=True)
time.sleep(120)
"""


def test_tree_cpu_counts_a_child_that_exited_once_through_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        before = sum(common.tree_cpu(parent.pid).values())
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "reaped"
        tree = common.tree_cpu(parent.pid)
        assert list(tree) == [parent.pid]  # the child is gone ...
        own = common.cpu_seconds(parent.pid, reaped=False) or 0.0
        spent = sum(tree.values()) - before
        # ... and its 0.3 s are in the parent's cutime+cstime, counted once (clock ticks of
        # 10 ms and the child's start-up account for the slack).
        assert 0.28 <= spent - own < 0.9, (spent, own)
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_cpu_seconds_of_a_process_that_is_gone_is_none() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert common.cpu_seconds(int(done.stdout)) is None


def test_the_neighbour_is_one_busy_process_stopped_by_its_pid() -> None:
    neighbour = common.start_neighbour()
    try:
        # taskset execs python: the PID is the busy process itself, not a wrapper.
        deadline = time.monotonic() + 30
        while (common.cpu_seconds(neighbour.pid) or 0.0) < 0.05:
            assert time.monotonic() < deadline, "the neighbour never ran"
            time.sleep(0.05)
        with open(f"/proc/{neighbour.pid}/cmdline", "rb") as fh:
            assert b"while True: pass" in fh.read()
    finally:
        common.stop_neighbour(neighbour)
    assert neighbour.poll() is not None
    assert not os.path.exists(f"/proc/{neighbour.pid}/stat") or _zombie_or_gone(neighbour.pid)


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_labelled_paired_section_leaves_the_full_runs_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "RESULTS.md"
    full = paired.heading("")
    results.write_text(f"# Benchmark results\n\n{full}\n\nthe full run's rounds\n")
    monkeypatch.setattr(paired, "BENCH", tmp_path)
    monkeypatch.setattr("bench.report.render", lambda: results.read_text())
    labelled = paired.heading("neighbour")
    paired.splice(f"{labelled}\n\nthe neighbour's rounds\n")
    paired.splice(f"{labelled}\n\nthe neighbour's rounds, again\n")
    text = results.read_text()
    assert "the full run's rounds" in text
    assert text.count(labelled) == 1
    assert "the neighbour's rounds, again" in text
    assert "the neighbour's rounds\n" not in text
