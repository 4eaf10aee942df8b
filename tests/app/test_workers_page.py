"""What operators see of worker liveness: /workers lists live, stopped and expired workers with
the steps each runs (linked to their workflows), flags a live worker on another code version,
highlights an expired worker whose steps await recovery, and the why-line of a running workflow
names its worker."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from geneva_drive import liveness
from geneva_drive.models import StepExecution, Worker, utcnow
from geneva_drive.testing import expire_worker
from geneva_drive.workflow import Workflow


def _register(name: str, monkeypatch: Any, version: str = "v1", queues: Any = ("default",)) -> int:
    monkeypatch.setenv("GENEVA_CODE_VERSION", version)
    return liveness.register("celery", queues, name=name).worker_id


def _run_on(session: Any, workflow: Any, worker_id: int, seconds_ago: int = 40) -> int:
    """``workflow``'s current step is running on ``worker_id``, started ``seconds_ago``."""
    started = utcnow() - timedelta(seconds=seconds_ago)
    execution = session.scalars(
        select(StepExecution.id).where(
            StepExecution.workflow_id == workflow.id, StepExecution.state == "scheduled"
        )
    ).one()
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution)
        .values(state="in_progress", started_at=started, worker_id=worker_id)
    )
    session.execute(update(Workflow).where(Workflow.id == workflow.id).values(state="performing"))
    session.commit()
    return int(execution)


def _row(html: str, worker_id: int) -> str:
    found = re.search(rf'<tr id="worker-{worker_id}"[^>]*>(.*?)</tr>', html, re.S)
    assert found, f"no row for worker {worker_id}"
    return found.group(0)


def test_workers_page_lists_states_running_steps_and_versions(
    operator_client: Any, geneva_session: Any, make_workflow: Any, monkeypatch: Any
) -> None:
    live = _register("celery@alpha/812", monkeypatch, "v2", ("default", "mail"))
    also_live = _register("celery@alpha/813", monkeypatch, "v2")
    behind = _register("celery@beta/77", monkeypatch, "v1")
    dead = _register("celery@gamma/9", monkeypatch, "v2")
    gone = liveness.register("embedded", name="embedded@delta/5")
    gone.start()
    gone.stop()
    running = make_workflow()
    orphan = make_workflow()
    _run_on(geneva_session, running, live)
    _run_on(geneva_session, orphan, dead)
    expire_worker(dead)
    geneva_session.execute(
        update(Worker).where(Worker.id == live).values(heartbeat_at=utcnow() - timedelta(seconds=3))
    )
    geneva_session.commit()

    response = operator_client.get("/workers")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "<h1>Workers</h1>" in html
    assert ">Workers</a>" in html  # in the main navigation
    assert "3 live · 1 expired · 1 stopped" in html

    row = _row(html, live)
    assert "<code>celery@alpha/812</code>" in row
    assert '<span class="badge tone-ok">live</span>' in row
    assert "<code>default</code>, <code>mail</code>" in row
    assert f'href="/workflows/{running.id}"' in row and "<code>charge</code>" not in row
    assert f"DashPayment #{running.id}</a> <code>authorize</code>" in row
    assert "for 40 s" in row or "for 41 s" in row
    assert re.search(r"<time [^>]*>[34] s ago</time>", row)  # last heartbeat, relative
    assert "deploy in progress" not in row
    assert "deploy in progress" not in _row(html, also_live)

    # v2 is what most live workers run; the v1 worker is flagged, with the reason.
    flagged = _row(html, behind)
    assert "deploy in progress" in flagged and "Most live workers run v2" in flagged
    assert "most run <code>v2</code>" in html

    expired = _row(html, dead)
    assert 'class="recovering"' in expired
    assert '<span class="badge tone-bad">expired</span>' in expired
    assert f'href="/workflows/{orphan.id}"' in expired
    assert "recovered at the next sweep" in expired
    assert "1 expired worker still holds running steps" in html
    assert "deploy in progress" not in expired  # only live workers are compared

    stopped = _row(html, gone.worker_id)
    assert '<span class="badge tone-muted">stopped</span>' in stopped
    assert "none (reads the table)" in stopped and "nothing" in stopped

    # Live first, then expired, then stopped.
    order = [int(i) for i in re.findall(r'<tr id="worker-(\d+)"', html)]
    assert order.index(dead) > max(order.index(w) for w in (live, also_live, behind))
    assert order.index(gone.worker_id) == len(order) - 1

    # The htmx poll gets the region alone.
    partial = operator_client.get("/workers", headers={"HX-Request": "true"})
    text = partial.get_data(as_text=True)
    assert text.lstrip().startswith('<div id="workers"') and "<html" not in text


def test_the_why_line_names_the_worker_running_the_step(
    operator_client: Any, geneva_session: Any, make_workflow: Any, monkeypatch: Any
) -> None:
    worker = _register("celery@alpha/812", monkeypatch)
    workflow = make_workflow()
    _run_on(geneva_session, workflow, worker, seconds_ago=40)

    detail = operator_client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert re.search(r"running <code>authorize</code> on celery@alpha/812 for 4[01] s", detail)
    listed = operator_client.get("/workflows").get_data(as_text=True)
    assert "<code>authorize</code> on celery@alpha/812 for" in listed


def test_a_worker_name_cannot_forge_markup_in_the_why_line(
    operator_client: Any, geneva_session: Any, make_workflow: Any, monkeypatch: Any
) -> None:
    worker = _register("celery@`evil`<b>/1", monkeypatch)
    workflow = make_workflow()
    _run_on(geneva_session, workflow, worker)
    detail = operator_client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert "on celery@&#39;evil&#39;&lt;b&gt;/1 for" in detail
    assert "<code>evil</code>" not in detail and "<b>/1" not in detail


def test_a_step_started_outside_any_worker_says_no_worker(
    operator_client: Any, geneva_session: Any, make_workflow: Any
) -> None:
    workflow = make_workflow()
    execution = _run_on(geneva_session, workflow, 1)
    geneva_session.execute(
        update(StepExecution).where(StepExecution.id == execution).values(worker_id=None)
    )
    geneva_session.commit()
    detail = operator_client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert re.search(r"running <code>authorize</code> for \d+ s", detail)


def test_workers_page_without_workers_explains_how_they_appear(
    operator_client: Any, viewer_client: Any
) -> None:
    for client in (operator_client, viewer_client):
        html = client.get("/workers").get_data(as_text=True)
        assert "No workers have registered in the last day" in html
        assert "<code>geneva-drive worker</code>" in html


@pytest.mark.parametrize("hours", [2, 30])
def test_stopped_workers_are_listed_for_a_day(
    operator_client: Any, geneva_session: Any, monkeypatch: Any, hours: int
) -> None:
    worker = _register("celery@old/1", monkeypatch)
    long_ago = utcnow() - timedelta(hours=hours)
    geneva_session.execute(
        update(Worker)
        .where(Worker.id == worker)
        .values(started_at=long_ago, heartbeat_at=long_ago, stopped_at=long_ago)
    )
    geneva_session.commit()
    html = operator_client.get("/workers").get_data(as_text=True)
    assert (f'id="worker-{worker}"' in html) is (hours < 24)
