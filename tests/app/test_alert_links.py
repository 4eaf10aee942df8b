"""Every alert in docs/prometheus-rules.yml links to the dashboard page that answers it, and
that page opens (for an operator who follows the link from the alert)."""

from __future__ import annotations

import re
from pathlib import Path

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus-rules.yml"


def _alerts() -> list[tuple[str, str]]:
    """(alert, dashboard_url) per rule: read line by line (no YAML library in the venv;
    promtool checks the file's syntax in tests/metrics/test_rules.py)."""
    found: list[tuple[str, str]] = []
    for block in re.split(r"\n\s*- alert: ", RULES.read_text())[1:]:
        name = block.split("\n", 1)[0].strip()
        url = re.search(r'\n\s*dashboard_url: "([^"]*)"', block)
        found.append((name, url.group(1) if url else ""))
    return found


def test_every_alert_links_to_a_dashboard_page_that_opens(operator_client, make_workflow):
    make_workflow(run=True)  # a DashPayment paused after its error: the lists have a row
    alerts = _alerts()
    assert alerts
    assert len(alerts) == RULES.read_text().count("- alert: ")
    for alert, url in alerts:
        assert url.startswith("DASHBOARD_URL/"), (alert, url)
        path = url.removeprefix("DASHBOARD_URL").replace("{{ $labels.workflow }}", "DashPayment")
        response = operator_client.get(path)
        assert response.status_code == 200, (alert, path, response.status_code)
