"""The per-(class, state) counts the overview and /metrics show come from
``geneva_drive_workflow_counts``, not from a scan of the workflows, and equal the exact SQL
count after everything that writes workflows: creating, running, failing, signals, the
operator's buttons, housekeeping's cleanup, a savepoint rolled back, an ORM delete, and
several threads at once.
"""

from __future__ import annotations

import contextlib
import re
import threading
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import delete, func, select

from geneva_drive import counts, db, housekeeping
from geneva_drive.config import settings
from geneva_drive.models import WorkflowCount, utcnow
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.app.conftest import DashPayment, post, run_to_finish
from tests.engine.helpers import make_order

_CELL = re.compile(r'<a href="([^"]*)">([\d,]+)</a></td>')


def exact(session: Any) -> dict[tuple[str, str], int]:
    rows = session.execute(
        select(Workflow.type, Workflow.state, func.count()).group_by(Workflow.type, Workflow.state)
    ).all()
    return {(t, s): int(n) for t, s, n in rows}


def overview_counts(client: Any) -> dict[tuple[str, str], int]:
    """The numbers of the overview's "Workflows by class and state" table (zeros left out)."""
    page = client.get("/")
    assert page.status_code == 200
    shown: dict[tuple[str, str], int] = {}
    for href, number in _CELL.findall(page.get_data(as_text=True)):
        query = parse_qs(urlsplit(href.replace("&amp;", "&")).query)
        if "state" in query and "class" in query and int(number.replace(",", "")):
            shown[(query["class"][0], query["state"][0])] = int(number.replace(",", ""))
    return shown


def metrics_counts(client: Any) -> dict[tuple[str, str], int]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.get_data(as_text=True)
    shown: dict[tuple[str, str], int] = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        if family.name == "geneva_drive_workflows":
            for sample in family.samples:
                if sample.value:
                    shown[(sample.labels["workflow"], sample.labels["state"])] = int(sample.value)
    return shown


def assert_counts_exact(session: Any, client: Any) -> dict[tuple[str, str], int]:
    session.expire_all()
    want = exact(session)
    assert counts.read(session) == want
    assert overview_counts(client) == want
    assert metrics_counts(client) == want
    return want


@pytest.fixture
def dash(app_factory):  # type: ignore[no-untyped-def]
    from tests.app.conftest import login

    app = app_factory(METRICS_TOKEN=None, METRICS_PUBLIC=True)
    return login(app.test_client(), "olga")


def _failed(session: Any) -> DashPayment:
    workflow = DashPayment.create(hero=make_order(session), session=session)
    session.commit()
    DashPayment.fail_charge = True
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(workflow)
    return workflow


def test_counts_shown_equal_exact_counts_after_a_mixed_workload(geneva_session, dash):
    session = geneva_session
    assert assert_counts_exact(session, dash) == {}

    failed = [_failed(session) for _ in range(3)]  # paused by the failing charge
    finished = []
    for _ in range(3):
        workflow = DashPayment.create(hero=make_order(session), session=session)
        session.commit()
        run_to_finish(workflow)
        finished.append(workflow)
    waiting = DashPayment.create(hero=make_order(session), session=session)
    session.commit()
    DashPayment.fail_charge = False
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(waiting)  # parks at confirm
    fresh = [DashPayment.create(hero=make_order(session), session=session) for _ in range(2)]
    session.commit()
    counted = assert_counts_exact(session, dash)
    assert counted[("DashPayment", "paused")] == 3
    assert counted[("DashPayment", "finished")] == 3

    # The operator's buttons (the ORM's flush and the engine's own writes).
    assert post(dash, f"/workflows/{failed[0].id}/cancel").status_code == 302
    assert post(dash, f"/workflows/{failed[1].id}/resume").status_code == 302
    assert post(dash, f"/workflows/{fresh[0].id}/pause").status_code == 302
    assert post(dash, f"/workflows/{fresh[1].id}/cancel").status_code == 302
    assert post(dash, f"/workflows/{waiting.id}/skip").status_code == 302
    refused = post(dash, f"/workflows/{finished[0].id}/pause")  # terminal: refused, no change
    assert refused.status_code == 409
    counted = assert_counts_exact(session, dash)
    assert counted[("DashPayment", "canceled")] == 2

    # A create whose transaction rolls back is not counted; nor is a savepoint rolled back.
    DashPayment.create(hero=make_order(session), session=session)
    session.rollback()
    with contextlib.suppress(RuntimeError), session.begin_nested():
        DashPayment.create(hero=make_order(session), session=session)
        raise RuntimeError("roll the savepoint back")
    session.commit()
    assert_counts_exact(session, dash)

    # An ORM delete, then housekeeping's cleanup of old finished/canceled workflows.
    session.delete(session.get(Workflow, finished[2].id))
    session.commit()
    long_ago = utcnow() - timedelta(days=40)
    for workflow in [*finished[:2], failed[0]]:
        session.get(Workflow, workflow.id).transitioned_at = long_ago
    session.commit()
    settings.delete_completed_workflows_after = timedelta(days=30)
    report = housekeeping.run()
    assert report.workflows_cleaned_up == 3
    counted = assert_counts_exact(session, dash)
    assert ("DashPayment", "finished") not in counted


def test_counts_follow_concurrent_workers(geneva_session, dash):
    """Threads creating, running and failing workflows at once, each transaction adding to
    a shard of its own choosing: the sums still equal the exact counts."""
    errors: list[BaseException] = []
    DashPayment.fail_charge = True

    def worker() -> None:
        session = db.new_session()
        try:
            for _ in range(4):
                for attempt in range(5):
                    try:
                        workflow = DashPayment.create(hero=make_order(session), session=session)
                        session.commit()
                        break
                    except Exception as error:  # a deadlock victim or busy SQLite: again
                        session.rollback()
                        if attempt == 4 or not _retryable(error):
                            raise
                with contextlib.suppress(RuntimeError):
                    speedrun_workflow(workflow)
        except BaseException as error:
            errors.append(error)
        finally:
            session.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    counted = assert_counts_exact(geneva_session, dash)
    assert sum(counted.values()) == 16
    shards = geneva_session.scalar(select(func.count(func.distinct(WorkflowCount.shard))))
    assert shards > 1  # spread over shards (8 of them; 4 threads x many transactions)


def _retryable(error: BaseException) -> bool:
    text = str(error).lower()
    return db.is_deadlock(error) or "locked" in text or "busy" in text


def test_rebuild_recounts_from_the_workflows(geneva_session, dash):
    session = geneva_session
    _failed(session)
    session.execute(delete(WorkflowCount))
    session.commit()
    assert counts.read(session) == {}
    counts.rebuild(session)
    session.commit()
    assert assert_counts_exact(session, dash) == {("DashPayment", "paused"): 1}
