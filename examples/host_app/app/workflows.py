"""The order workflow: reserve every line (a resumable step over the shop's own table), wait
for the payment webhook, then ship after a short wait."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.models import OrderLine
from geneva_drive import IterableStep, Workflow, resumable_step, step


class OrderWorkflow(Workflow):
    @resumable_step
    def reserve_lines(self, it: IterableStep) -> None:
        lines = select(OrderLine).where(OrderLine.order_id == self.hero.id)
        it.iterate_over_records(lines, self._reserve)

    def _reserve(self, line: OrderLine) -> None:
        line.reserved = True

    @step(wait_for="payment_received")
    def capture_payment(self) -> None:
        self.hero.paid_cents = int(self.received_signal.payload["amount_cents"])
        self.hero.status = "paid"

    @step(wait=timedelta(seconds=2))
    def ship(self) -> None:
        self.hero.status = "shipped"
