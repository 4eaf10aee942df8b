"""Fulfilment: ship each line of an order as a child workflow, invoice once all have ended
(SPEC §6.3, fan-out and join).

``FulfilmentWorkflow.ship`` starts one ``ShipLineWorkflow`` per line of the order; ``invoice``
waits for all of them (``wait_for_children=True``) and pauses the order if a line was canceled.
In the demo, a parent's page shows "children: 3 of 5 finished, 1 paused, 1 running" and links
to its children; each child links back to its parent.
"""

from __future__ import annotations

from geneva_drive import Workflow, step
from geneva_drive.examples._work import work

#: Lines per demo order.
LINES = 5


class ShipLineWorkflow(Workflow):
    @step
    def pick(self) -> None:
        work()

    @step
    def ship(self) -> None:
        work()


class FulfilmentWorkflow(Workflow):
    cancel_children = True

    @step
    def ship(self) -> None:
        for _ in range(LINES):
            # The demo's lines are not rows of their own: each child has the order as its hero.
            self.start_child(ShipLineWorkflow, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True, on_child_failure="pause")
    def invoice(self) -> None:
        work()
