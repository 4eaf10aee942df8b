"""The pre-deploy check, as the shop's CI runs it (docs/MANUAL.md of GenevaDrive,
"Check before each deploy: `geneva-drive check-deploy`"): an order is parked on
``capture_payment`` under the current code; a release that renames the step without leaving
its old name behind fails ``geneva-drive check-deploy`` (exit 1, naming the fix); the same
release with ``capture_payment = renamed_step(to=...)`` passes (exit 0).

The release candidates are the shop's own app/workflows.py with the change applied, written
next to the test; the command runs in a subprocess with them as GENEVA_WORKFLOW_MODULES,
against the test database, exactly as a pipeline runs it against production."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import sign_in

from app.workflows import OrderWorkflow
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step

SHOP = Path(__file__).resolve().parents[1]
CURRENT = (SHOP / "app" / "workflows.py").read_text()
RENAMED = CURRENT.replace("def capture_payment(", "def take_payment(")
WITH_GRAVESTONE = RENAMED.replace(
    "class OrderWorkflow(Workflow):\n",
    'class OrderWorkflow(Workflow):\n    capture_payment = renamed_step(to="take_payment")\n\n',
).replace("resumable_step, step", "renamed_step, resumable_step, step")


def _check_deploy(geneva_database, release: Path, module: str) -> subprocess.CompletedProcess[str]:
    url = geneva_database.url
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    env = {
        **os.environ,
        "GENEVA_DATABASE_URL": url,
        "GENEVA_WORKFLOW_MODULES": module,
        "PYTHONPATH": os.pathsep.join([str(release), str(SHOP)]),
        "GENEVA_LOG_LEVEL": "WARNING",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / "geneva-drive"), "check-deploy", "--json"],
        env=env,
        cwd=release,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_rename_that_would_strand_fails_the_check_and_passes_with_renamed_step(
    shop, geneva_database, geneva_session, tmp_path
):
    assert "renamed_step(to=" in WITH_GRAVESTONE  # the edit applied
    client = shop.test_client()
    sign_in(client, "alice")
    created = client.post("/orders", data={"sku": ["a-1"]}).get_json()
    workflow = geneva_session.get(OrderWorkflow, created["workflow_id"])
    perform_next_step(workflow)
    perform_next_step(workflow)
    assert_waiting_for_signal(workflow, "payment_received")
    geneva_session.commit()

    (tmp_path / "release_renamed.py").write_text(RENAMED)
    (tmp_path / "release_fixed.py").write_text(WITH_GRAVESTONE)

    strands = _check_deploy(geneva_database, tmp_path, "release_renamed")
    assert strands.returncode == 1, strands.stdout + strands.stderr
    (problem,) = json.loads(strands.stdout)["problems"]
    assert (problem["workflow_class"], problem["step"], problem["count"]) == (
        "OrderWorkflow",
        "capture_payment",
        1,
    )
    assert problem["example_id"] == workflow.id
    assert problem["fix"].startswith('capture_payment = renamed_step(to="take_payment")')

    fixed = _check_deploy(geneva_database, tmp_path, "release_fixed")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert json.loads(fixed.stdout)["ok"] is True
