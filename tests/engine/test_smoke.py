from datetime import timedelta

from geneva_drive import Workflow, step
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import make_order


def test_three_steps_run_in_order(geneva_session):
    calls = []

    class SmokeWorkflow(Workflow):
        @step
        def one(self):
            calls.append("one")

        @step(wait=timedelta(days=2))
        def two(self):
            calls.append("two")

        @step
        def three(self):
            calls.append("three")

    order = make_order(geneva_session)
    wf = SmokeWorkflow.create(hero=order)
    assert wf.next_step_name == "one"
    speedrun_workflow(wf)
    assert calls == ["one", "two", "three"]
    assert wf.state == "finished"
