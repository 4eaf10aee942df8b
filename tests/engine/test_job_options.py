"""Job options (docs/MANUAL.md, "Job options"): validation, the three-level merge, and
what is recorded on the transport (queue, priority, countdown) for every send of a step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from geneva_drive import Workflow, settings, step, with_inline_enqueue
from geneva_drive.errors import StepConfigurationError
from geneva_drive.job_options import validate_job_options
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import executions, make_order

# --- validation -----------------------------------------------------------------------------


def test_valid_options_are_copied_with_string_keys():
    when = datetime(2030, 1, 1, tzinfo=UTC)
    options = {
        "queue": "payments",
        "priority": -3,
        "wait": timedelta(seconds=5),
        "wait_until": when,
    }
    assert validate_job_options(options, "ctx") == options
    assert validate_job_options({"wait": 0, "wait_until": 1_900_000_000.5}, "ctx") == {
        "wait": 0,
        "wait_until": 1_900_000_000.5,
    }
    assert validate_job_options(None, "ctx") == {}
    assert validate_job_options({"queue": None, "priority": None}, "ctx") == {
        "queue": None,
        "priority": None,
    }


def test_non_mapping_is_refused():
    with pytest.raises(StepConfigurationError) as info:
        validate_job_options([("queue", "x")], "Step 'charge'")
    assert str(info.value) == "Step 'charge' has invalid job_options: expected a dict, got list"


def test_unknown_keys_are_listed_with_the_allowed_ones():
    with pytest.raises(StepConfigurationError) as info:
        validate_job_options({"piority": 1, "queu": "x", "queue": "ok"}, "Step 'charge'")
    assert str(info.value) == (
        "Step 'charge' has unknown job_options key(s): piority, queu. Only these are recognized: "
        "wait, wait_until, queue, priority"
    )


@pytest.mark.parametrize(
    ("key", "value", "expectation"),
    [
        ("wait", -1, "non-negative"),
        ("wait", timedelta(seconds=-1), "non-negative"),
        ("wait", "5", "non-negative"),
        ("wait", True, "non-negative"),
        ("wait_until", "tomorrow", "datetime or a UNIX timestamp"),
        ("queue", 5, "non-empty queue name"),
        ("queue", "  ", "non-empty queue name"),
        ("priority", 1.5, "an integer"),
        ("priority", "high", "an integer"),
        ("priority", False, "an integer"),
    ],
)
def test_invalid_values_name_the_key_value_and_type(key, value, expectation):
    with pytest.raises(StepConfigurationError) as info:
        validate_job_options({key: value}, "Ctx")
    message = str(info.value)
    assert message.startswith(
        f"Ctx has invalid job_options[{key!r}]: {value!r} ({type(value).__name__})"
    )
    assert expectation in message


def test_instance_level_options_are_validated_on_create(geneva_session):
    class JobOptsInstanceBad(Workflow):
        @step
        def only(self):
            pass

    with pytest.raises(
        StepConfigurationError, match=r"JobOptsInstanceBad\.step_job_options has unknown"
    ):
        JobOptsInstanceBad.create(hero=make_order(geneva_session), step_job_options={"q": 1})


def test_instance_level_setter_blank_clears(geneva_session):
    class JobOptsSetter(Workflow):
        @step
        def only(self):
            pass

    wf = JobOptsSetter.create(hero=make_order(geneva_session), step_job_options={"queue": "a"})
    wf.step_job_options = {"wait": timedelta(seconds=90)}
    assert wf.metadata_["step_job_options"] == {"wait": 90.0}  # JSON-safe in metadata
    assert wf.step_job_options == {"wait": 90.0}
    wf.step_job_options = {}
    assert wf.metadata_["step_job_options"] is None
    assert wf.step_job_options == {}
    wf.step_job_options = None
    assert wf.step_job_options == {}


# --- merge and what is sent ---------------------------------------------------------------------


class JobOptsParent(Workflow):
    step_job_options = {"queue": "parent", "priority": 1}


class JobOptsChild(JobOptsParent):
    step_job_options = {"priority": 2}

    @step
    def a(self):
        pass

    @step(job_options={"priority": 9})
    def b(self):
        pass

    @step(job_options={"queue": "step-queue"})
    def c(self):
        raise TimeoutError("retry me")


def test_class_options_merge_parent_under_child():
    assert JobOptsChild.class_step_job_options() == {"queue": "parent", "priority": 2}
    assert JobOptsParent.class_step_job_options() == {"queue": "parent", "priority": 1}


def test_messages_carry_the_merged_options_for_each_step(geneva_session, geneva_transport):
    wf = JobOptsChild.create(hero=make_order(geneva_session))
    plain = JobOptsChild.create(hero=make_order(geneva_session), allow_multiple=True)
    wf.step_job_options = {"queue": "instance"}
    geneva_session.commit()
    perform_next_step(wf)  # a -> schedules b
    perform_next_step(plain)
    sent = {(m.execution_id): m for m in geneva_transport.messages}
    a_ex, b_ex = executions(geneva_session, wf)
    pa, pb = executions(geneva_session, plain)
    assert (sent[pa.id].queue, sent[pa.id].priority) == ("parent", 2)
    # class < instance < step
    assert (sent[a_ex.id].queue, sent[a_ex.id].priority) == ("parent", 2)  # created before the set
    assert (sent[b_ex.id].queue, sent[b_ex.id].priority) == ("instance", 9)
    assert (sent[pb.id].queue, sent[pb.id].priority) == ("parent", 9)
    assert sent[b_ex.id].job_id == b_ex.job_id and b_ex.sent_at is not None
    assert sent[b_ex.id].countdown is None


def test_instance_options_given_at_create_apply_to_the_first_step(geneva_session, geneva_transport):
    wf = JobOptsChild.create(
        hero=make_order(geneva_session), step_job_options={"queue": "vip", "priority": 5}
    )
    geneva_session.commit()
    [message] = geneva_transport.messages
    assert message.execution_id == wf.current_execution.id
    assert (message.queue, message.priority) == ("vip", 5)


def test_reattempts_and_resumes_are_sent_with_the_same_options(geneva_session, geneva_transport):
    class JobOptsRetry(Workflow):
        step_job_options = {"queue": "retry", "priority": 4}

        @step(on_exception="reattempt", max_reattempts=1, job_options={"priority": 7})
        def flaky(self):
            raise TimeoutError("t")

    wf = JobOptsRetry.create(hero=make_order(geneva_session))
    geneva_session.commit()
    for _ in range(2):
        with pytest.raises(TimeoutError):
            perform_next_step(wf)
    assert wf.state == "paused"
    wf.resume()
    geneva_session.commit()
    ids = [e.id for e in executions(geneva_session, wf)]
    assert geneva_transport.execution_ids == ids  # first send, reattempt, resume
    assert {(m.queue, m.priority) for m in geneva_transport.messages} == {("retry", 7)}


def test_nothing_is_sent_before_commit_or_after_rollback(geneva_session, geneva_transport):
    wf = JobOptsChild.create(hero=make_order(geneva_session))
    assert geneva_transport.messages == []
    geneva_session.rollback()
    assert geneva_transport.messages == []
    JobOptsChild.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert len(geneva_transport.messages) == 1
    assert wf is not None


def test_inline_enqueue_sends_at_once(geneva_session, geneva_transport):
    with with_inline_enqueue():
        with with_inline_enqueue():
            pass
        wf = JobOptsChild.create(hero=make_order(geneva_session))
        assert geneva_transport.execution_ids == [wf.current_execution.id]
    JobOptsChild.create(hero=make_order(geneva_session))
    assert len(geneva_transport.messages) == 1  # deferred again outside the block
    geneva_session.commit()
    assert len(geneva_transport.messages) == 2


def test_enqueue_after_commit_false_sends_at_once(geneva_session, geneva_transport):
    settings.enqueue_after_commit = False
    JobOptsChild.create(hero=make_order(geneva_session))
    assert len(geneva_transport.messages) == 1


def test_executions_due_beyond_the_horizon_are_left_to_the_dispatcher(
    geneva_session, geneva_transport
):
    class JobOptsLater(Workflow):
        @step(wait=timedelta(days=7))
        def later(self):
            pass

        @step(wait=timedelta(seconds=30))
        def soon(self):
            pass

    wf = JobOptsLater.create(hero=make_order(geneva_session))
    geneva_session.commit()
    [ex] = executions(geneva_session, wf)
    assert geneva_transport.messages == []
    assert ex.sent_at is None and ex.job_id is None
    perform_next_step(wf)  # test helpers run future executions at once
    soon = executions(geneva_session, wf)[-1]
    [message] = geneva_transport.messages
    assert message.execution_id == soon.id
    assert 25 <= message.countdown <= 30


def test_wait_job_option_delays_the_message_not_scheduled_for(geneva_session, geneva_transport):
    class JobOptsDelayed(Workflow):
        @step(job_options={"wait": 20})
        def only(self):
            pass

    wf = JobOptsDelayed.create(hero=make_order(geneva_session))
    geneva_session.commit()
    [ex] = executions(geneva_session, wf)
    [message] = geneva_transport.messages
    assert 15 <= message.countdown <= 20
    assert (ex.scheduled_for - ex.created_at) < timedelta(seconds=2)


def test_wait_until_job_option_delays_the_message(geneva_session, geneva_transport):
    from geneva_drive.models import utcnow

    class JobOptsWaitUntil(Workflow):
        @step
        def only(self):
            pass

    wf = JobOptsWaitUntil.create(
        hero=make_order(geneva_session),
        step_job_options={"wait_until": utcnow() + timedelta(seconds=40)},
    )
    geneva_session.commit()
    [message] = geneva_transport.messages
    assert 35 <= message.countdown <= 40
    [ex] = executions(geneva_session, wf)
    assert (ex.scheduled_for - ex.created_at) < timedelta(seconds=2)


def test_inline_enqueue_restores_the_previous_mode_after_an_exception(
    geneva_session, geneva_transport
):
    from geneva_drive.transport import enqueues_deferred

    assert enqueues_deferred()
    with pytest.raises(KeyError), with_inline_enqueue():
        assert not enqueues_deferred()
        raise KeyError("x")
    assert enqueues_deferred()
