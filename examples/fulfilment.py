"""Fulfilment: ship each line of an order as a child workflow, invoice once all have ended
(docs/MANUAL.md, "Fan-out and join: child workflows").

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


class LabelPrinterOffline(RuntimeError):
    """The warehouse's label printer did not answer: a line pauses until an operator looks."""


class WaveLineWorkflow(Workflow):
    """A line of a warehouse wave: its label fails to print for every third line (the demo's
    failed children); the line pauses after the error, and the wave's invoice waits."""

    #: Every n-th line (by id) finds the printer offline.
    PRINTER_OFFLINE_EVERY = 3

    @step(on_exception="pause")
    def print_label(self) -> None:
        work()
        if self.id % self.PRINTER_OFFLINE_EVERY == 0:
            raise LabelPrinterOffline(f"label printer lp-2 did not answer for line #{self.id}")

    @step
    def ship(self) -> None:
        work()


class WarehouseWaveWorkflow(Workflow):
    """A wave of many lines fanned out at once; it invoices when every line has ended. On the
    parent's page: "4 children paused after errors: waiting for them since …"."""

    #: Lines per demo wave.
    LINES = 12

    @step
    def release(self) -> None:
        for _ in range(self.LINES):
            self.start_child(WaveLineWorkflow, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True, on_child_failure="pause")
    def invoice(self) -> None:
        work()
