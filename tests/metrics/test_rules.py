"""docs/prometheus-rules.yml: valid for promtool, its alerts fire as intended (promtool's rule
unit tests), and every metric it names is one we export."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from geneva_drive.metrics import ClassMetrics, MetricsSnapshot
from geneva_drive.models import utcnow
from geneva_drive.prometheus import EventMetrics, LimitCollector, snapshot_metrics

# Does not use the suite's database (promtool on the rules file): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus-rules.yml"
RULE_TESTS = Path(__file__).with_name("prometheus-rules-test.yml")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
            pytest.fail("promtool is required (apt-get install prometheus)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return found


def test_promtool_check_rules():
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alerts_fire_as_intended():
    result = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _exported_names() -> set[str]:
    snapshot = MetricsSnapshot(
        taken_at=utcnow(),
        classes=(ClassMetrics("X", {"ready": 1}),),
        waiting_visibility_threshold=timedelta(days=7),
        stuck_in_progress_threshold=timedelta(hours=1),
    )
    names = {family.name for family in snapshot_metrics(snapshot)} | {"geneva_drive_database_up"}
    names |= set(LimitCollector.NAMES)
    registry = CollectorRegistry()
    EventMetrics.create(registry)
    for family in registry.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
    # Labelled counters and histograms have no samples until used: add their series names.
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
    return names


def test_rules_only_use_exported_metrics():
    used = set(re.findall(r"\bgeneva_drive_[a-z_]+", RULES.read_text()))
    assert used, "the rules name no metric"
    assert used <= _exported_names(), used - _exported_names()
