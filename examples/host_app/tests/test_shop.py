"""The shop's route and the workflow it starts, end to end in-process: an order is created
through the shop's route, reserves its lines, parks for the payment, is woken by the webhook
and ships. Steps run through GenevaDrive's real executor (geneva_drive.testing)."""

from __future__ import annotations

from conftest import sign_in

from app import db
from app.workflows import OrderWorkflow
from geneva_drive.testing import assert_waiting_for_signal, perform_next_step, speedrun_workflow


def test_an_order_waits_for_its_payment_and_ships(shop, geneva_session):
    client = shop.test_client()
    sign_in(client, "alice")
    created = client.post("/orders", data={"sku": ["a-1", "b-2"]}).get_json()
    workflow = geneva_session.get(OrderWorkflow, created["workflow_id"])

    perform_next_step(workflow)  # reserve_lines walks the order's lines
    perform_next_step(workflow)  # capture_payment finds no payment yet: it parks
    assert_waiting_for_signal(workflow, "payment_received")
    assert client.get(f"/orders/{created['id']}").get_json()["lines_reserved"] == [True, True]

    event = {"order_id": created["id"], "amount_cents": 1250, "event_id": "evt_1"}
    assert client.post("/webhooks/payments", json=event).status_code == 202
    # The provider retries: the idempotency key makes the second delivery harmless.
    assert client.post("/webhooks/payments", json=event).status_code == 202

    speedrun_workflow(workflow)
    order = client.get(f"/orders/{created['id']}").get_json()
    assert order["workflow_state"] == "finished"
    assert (order["status"], order["paid_cents"]) == ("shipped", 1250)


def test_the_dashboard_is_mounted_behind_the_shops_login(shop, geneva_session):
    operator = shop.test_client()
    sign_in(operator, "alice")
    created = operator.post("/orders").get_json()
    page = operator.get(f"/admin/workflows/workflows/{created['workflow_id']}")
    assert page.status_code == 200
    assert "OrderWorkflow" in page.text

    shopper = shop.test_client()
    sign_in(shopper, "bob")
    assert shopper.get("/admin/workflows/").status_code == 403
    assert shopper.get("/account").status_code == 200  # still signed in to the shop

    anonymous = shop.test_client()
    response = anonymous.get("/admin/workflows/")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/login?next=")

    with shop.app_context():
        assert db.session.get(OrderWorkflow, created["workflow_id"]) is not None


def test_health_under_the_prefix_and_a_stranded_step_in_the_metrics(shop, geneva_session):
    from prometheus_client import REGISTRY
    from sqlalchemy import update

    from geneva_drive.errors import StepNotDefinedError
    from geneva_drive.models import StepExecution

    # The manual's <prefix>/healthz, for the host's load balancer: no login needed.
    health = shop.test_client().get("/admin/workflows/healthz")
    assert health.status_code == 200
    assert health.get_json() == {"status": "ok", "database": "ok"}

    # A deploy renamed a step while an order was scheduled on it: the run pauses the workflow
    # (stranded), and step_executions_total counts it with an outcome of its own.
    client = shop.test_client()
    sign_in(client, "alice")
    created = client.post("/orders").get_json()
    workflow = geneva_session.get(OrderWorkflow, created["workflow_id"])
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id, StepExecution.state == "scheduled")
        .values(step_name="reserve_stock")
    )
    geneva_session.commit()
    labels = {"workflow": "OrderWorkflow", "step": "reserve_stock", "outcome": "step_not_defined"}
    before = REGISTRY.get_sample_value("geneva_drive_step_executions_total", labels) or 0.0
    try:
        perform_next_step(workflow)
    except StepNotDefinedError:
        pass  # the executor raises it to its caller; the workflow is paused either way
    after = REGISTRY.get_sample_value("geneva_drive_step_executions_total", labels)
    assert after == before + 1
    stranded = client.get("/admin/workflows/stranded")
    assert "reserve_stock" in stranded.text
