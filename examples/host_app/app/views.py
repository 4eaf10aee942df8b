"""The shop's own pages: login, orders, and the payment provider's webhook."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user

from app import db
from app.models import Order, OrderLine, User
from app.workflows import OrderWorkflow
from geneva_drive.errors import WorkflowNotOngoingError

bp = Blueprint("shop", __name__)


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    error = None
    if request.method == "POST":
        user = db.session.scalar(db.select(User).filter_by(name=request.form["name"]))
        if user is not None and user.check_password(request.form["password"]):
            login_user(user)
            target = request.args.get("next") or ""
            # Same-site paths only (no open redirect).
            same_site = target.startswith("/") and not target.startswith("//")
            return redirect(target if same_site else url_for("shop.account"))
        error = "Wrong name or password."
    return render_template("login.html", error=error), 401 if error else 200


@bp.post("/logout")
def logout() -> Any:
    logout_user()
    return redirect(url_for("shop.login"))


@bp.get("/account")
@login_required
def account() -> Any:
    return render_template("account.html", user=current_user)


@bp.post("/orders")
@login_required
def create_order() -> Any:
    order = Order(customer=current_user.name)
    db.session.add(order)
    db.session.flush()
    for sku in request.form.getlist("sku") or ["sku-1"]:
        db.session.add(OrderLine(order_id=order.id, sku=sku))
    # The workflow's rows are written in the shop's own transaction: committed together,
    # and its first step is sent to Celery only after this commit.
    OrderWorkflow.create(hero=order, session=db.session)
    db.session.commit()
    return jsonify(order_status(order)), 201


@bp.get("/orders/<int:order_id>")
@login_required
def show_order(order_id: int) -> Any:
    order = db.session.get(Order, order_id) or abort(404)
    return jsonify(order_status(order))


@bp.post("/webhooks/payments")
def payment_webhook() -> Any:
    """The payment provider calls this; its event id makes a retried delivery harmless."""
    event = request.get_json(force=True)
    order = db.session.get(Order, int(event["order_id"])) or abort(404)
    workflows = OrderWorkflow.for_hero(db.session, order)
    if not workflows:
        abort(404)
    try:
        signal = workflows[-1].signal(
            "payment_received",
            payload={"amount_cents": int(event["amount_cents"])},
            idempotency_key=str(event["event_id"]),
        )
    except WorkflowNotOngoingError:
        return jsonify({"status": "ignored"}), 200
    db.session.commit()
    return jsonify({"signal": signal.state}), 202


def order_status(order: Order) -> dict[str, Any]:
    workflows = OrderWorkflow.for_hero(db.session, order)
    workflow = workflows[-1] if workflows else None
    return {
        "id": order.id,
        "status": order.status,
        "paid_cents": order.paid_cents,
        "workflow_id": workflow.id if workflow else None,
        "workflow_state": workflow.state if workflow else None,
        "next_step": workflow.next_step_name if workflow else None,
        "lines_reserved": [
            line.reserved
            for line in db.session.scalars(db.select(OrderLine).filter_by(order_id=order.id))
        ],
    }
