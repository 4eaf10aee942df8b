"""Payment: authorize, then park until the payment provider's ``payment_confirmed`` webhook
arrives (``workflow.signal("payment_confirmed", {"amount_cents": …}, idempotency_key=…)``),
capture the confirmed amount and send a receipt. A voided order cancels the workflow."""

from __future__ import annotations

from geneva_drive import Workflow, step
from geneva_drive.examples._work import work


class PaymentWorkflow(Workflow):
    cancel_if = "order_voided"

    @step
    def authorize(self) -> None:
        work()

    @step(wait_for="payment_confirmed")
    def capture(self) -> None:
        work()
        self.hero.captured_cents = int(self.received_signal.payload["amount_cents"])

    @step
    def send_receipt(self) -> None:
        work()

    def order_voided(self) -> bool:
        return bool(self.hero.voided)
