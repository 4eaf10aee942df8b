"""A scheduled workflow for the dispatcher processes of test_schedule_dispatchers.py.

Imported only by those subprocesses (``GENEVA_WORKFLOW_MODULES``), never by the test process: a
class with a schedule is registered for its whole process, and every other test's dispatcher
sweep there would write and fire its row.
"""

from __future__ import annotations

from geneva_drive import Schedule, Workflow, step


class EverySecond(Workflow):
    may_proceed_without_hero = True
    # overlap="allow": every tick creates a workflow (nothing runs them here), so the count of
    # workflows is the count of ticks fired.
    schedule = Schedule(every=1, overlap="allow", catch_up="all")

    @step
    def tick(self) -> None:
        pass
