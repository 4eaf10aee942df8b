"""Checkout: reserve the stock, then wait for the payment at most ``PAYMENT_WINDOW``; an
abandoned checkout (no ``payment_confirmed`` in time) is canceled by its time-out (docs/MANUAL.md,
"Time-bounded waits").

The window is short on purpose: in the demo, a checkout started now times out while you watch
its why-line count down ("… — times out in 1 min 10 s (then cancel)") and its row move up the
signal inbox, which lists the soonest time-outs first. A real shop would wait days.
"""

from __future__ import annotations

from datetime import timedelta

from geneva_drive import Workflow, step
from geneva_drive.examples._work import work

#: How long a checkout waits for its payment before it is canceled.
PAYMENT_WINDOW = timedelta(seconds=75)


class CheckoutWorkflow(Workflow):
    @step
    def reserve_stock(self) -> None:
        work()

    @step(wait_for="payment_confirmed", timeout=PAYMENT_WINDOW, on_timeout="cancel")
    def capture(self) -> None:
        work()
        self.hero.captured_cents = int(self.received_signal.payload["amount_cents"])

    @step
    def ship(self) -> None:
        work()
