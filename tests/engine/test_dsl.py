"""Class-definition-time DSL: step registration, validation messages (naming the class, the
step and the fix), ordering, inheritance without mutating parents, add_step and removed_step
(docs/MANUAL.md, "Defining steps")."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import (
    ExceptionPolicy,
    SignalMatcher,
    Workflow,
    removed_step,
    resumable_step,
    step,
)
from geneva_drive.errors import StepConfigurationError
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import workflow_class
from tests.engine.helpers import make_order

# --- registration and ordering ---------------------------------------------------------------


def test_steps_run_in_definition_order_with_method_names(geneva_session):
    calls = []

    class DslOrderWorkflow(Workflow):
        @step
        def alpha(self):
            calls.append("alpha")

        @step(name="custom_beta")
        def beta(self):
            calls.append("beta")

        @step
        def gamma(self):
            calls.append("gamma")

    assert DslOrderWorkflow.steps.names == ["alpha", "custom_beta", "gamma"]
    assert DslOrderWorkflow.workflow_name == "DslOrderWorkflow"
    assert workflow_class("DslOrderWorkflow") is DslOrderWorkflow
    wf = DslOrderWorkflow.create(hero=make_order(geneva_session))
    assert wf.type == "DslOrderWorkflow"
    speedrun_workflow(wf)
    assert calls == ["alpha", "beta", "gamma"]
    assert wf.state == "finished"


def test_workflow_name_overrides_the_stored_type(geneva_session):
    class DslNamedWorkflow(Workflow):
        workflow_name = "billing.Renewal"

        @step
        def only(self):
            pass

    assert workflow_class("billing.Renewal") is DslNamedWorkflow
    wf = DslNamedWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert wf.type == "billing.Renewal"


def test_before_and_after_step_positioning():
    class DslPositionWorkflow(Workflow):
        @step
        def a(self):
            pass

        @step
        def b(self):
            pass

        @step(before_step="b")
        def c(self):
            pass

        @step(after_step="a")
        def d(self):
            pass

        @step(after_step="b")
        def e(self):
            pass

    # unpositioned in declaration order, then each positioned step inserted in declaration order
    assert DslPositionWorkflow.steps.names == ["a", "d", "c", "b", "e"]


def test_positioning_can_reference_inherited_steps_and_gravestones():
    class DslPosParent(Workflow):
        @step
        def one(self):
            pass

        gone = removed_step()

        @step
        def two(self):
            pass

    class DslPosChild(DslPosParent):
        @step(before_step="one")
        def zero(self):
            pass

        @step(after_step="gone")
        def after_gone(self):
            pass

    assert DslPosChild.steps.names == ["zero", "one", "gone", "after_gone", "two"]
    assert DslPosParent.steps.names == ["one", "gone", "two"]


def test_before_step_must_name_an_already_defined_step():
    with pytest.raises(StepConfigurationError) as info:

        class DslBadRefWorkflow(Workflow):
            @step(before_step="later")
            def first(self):
                pass

            @step
            def later(self):
                pass

    assert str(info.value) == (
        "Step 'first' references non-existent step 'later' in before_step=. You can only "
        "reference steps that have already been defined."
    )
    assert workflow_class("DslBadRefWorkflow") is None


def test_after_step_must_name_an_existing_step():
    with pytest.raises(StepConfigurationError, match="non-existent step 'nope' in after_step="):

        class DslBadAfterWorkflow(Workflow):
            @step(after_step="nope")
            def first(self):
                pass


def test_both_before_and_after_is_rejected():
    with pytest.raises(StepConfigurationError) as info:

        class DslBothWorkflow(Workflow):
            @step
            def a(self):
                pass

            @step(before_step="a", after_step="a")
            def b(self):
                pass

    message = str(info.value)
    assert "Step 'b' of DslBothWorkflow" in message
    assert "cannot specify both before_step= and after_step=" in message


def test_duplicate_step_name_is_rejected_including_inherited():
    class DslDupParent(Workflow):
        @step
        def shared(self):
            pass

    with pytest.raises(StepConfigurationError) as info:

        class DslDupChild(DslDupParent):
            @step(name="shared")
            def other(self):
                pass

    assert str(info.value) == "Step 'shared' is already defined in DslDupChild"

    with pytest.raises(StepConfigurationError, match="Step 'x' is already defined in DslDupSame"):

        class DslDupSame(Workflow):
            @step(name="x")
            def a(self):
                pass

            @step(name="x")
            def b(self):
                pass


def test_a_class_that_fails_validation_is_not_registered_and_can_be_defined_again(geneva_session):
    with pytest.raises(StepConfigurationError):

        class DslRetryWorkflow(Workflow):
            @step(wait=-5)
            def first(self):
                pass

    assert workflow_class("DslRetryWorkflow") is None

    class DslRetryWorkflow(Workflow):
        @step(wait=5)
        def first(self):
            pass

    assert workflow_class("DslRetryWorkflow") is DslRetryWorkflow
    wf = DslRetryWorkflow.create(hero=make_order(geneva_session))
    assert wf.next_step_name == "first"


# --- option validation ---------------------------------------------------------------------


def _define(**options):
    class DslValidationWorkflow(Workflow):
        @step(**options)
        def charge(self):
            pass

    return DslValidationWorkflow


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"wait": "1 hour"}, ["wait=", "takes a duration", "use wait_for="]),
        ({"wait": SignalMatcher("paid")}, ["takes a duration", "use wait_for="]),
        ({"wait": -1}, ["invalid wait value: must be non-negative"]),
        ({"wait": timedelta(seconds=-1)}, ["invalid wait value: must be non-negative"]),
        ({"wait": [1]}, ["invalid wait="]),
        (
            {"wait_for": timedelta(hours=1)},
            ["wait_for=", "takes a signal name or matcher", "use wait="],
        ),
        ({"wait_for": 30}, ["takes a signal name or matcher", "use wait="]),
        ({"wait_for": object()}, ["invalid wait_for=", "matches(signal)", "object"]),
        (
            {"on_exception": "explode"},
            ["invalid on_exception='explode'", "must be one of pause, cancel, reattempt, skip"],
        ),
        (
            {"on_exception": [ExceptionPolicy("pause"), "cancel"]},
            ["on_exception list element", "ExceptionPolicy"],
        ),
        ({"on_exception": 42}, ["invalid on_exception=42"]),
        ({"max_reattempts": 3}, ['has max_reattempts= but on_exception= is not "reattempt"']),
        (
            {"on_exception": "pause", "max_reattempts": 3},
            ['max_reattempts= only makes sense with action "reattempt"'],
        ),
        (
            {"on_exception": ExceptionPolicy("reattempt"), "max_reattempts": 3},
            [
                "max_reattempts= but on_exception= is an ExceptionPolicy",
                "set max_reattempts on the policy",
            ],
        ),
        (
            {"on_exception": "reattempt", "max_reattempts": 0},
            ["max_reattempts= must be a positive integer or None, got 0"],
        ),
        ({"on_exception": "reattempt", "max_reattempts": -2}, ["positive integer", "got -2"]),
        ({"on_exception": "reattempt", "max_reattempts": 1.5}, ["positive integer", "got 1.5"]),
        ({"terminal_action": "cancel"}, ['terminal_action= but on_exception= is not "reattempt"']),
        (
            {"on_exception": "skip", "terminal_action": "cancel"},
            ['terminal_action= only makes sense with action "reattempt"'],
        ),
        (
            {"on_exception": lambda wf, e: None, "terminal_action": "cancel"},
            ["terminal_action= but on_exception= is an ExceptionPolicy, callable"],
        ),
        (
            {"on_exception": "reattempt", "terminal_action": "reattempt"},
            ["terminal_action= must be one of pause, cancel, skip, got 'reattempt'"],
        ),
        ({"skip_if": 12}, ["invalid skip_if=", "but was int"]),
        ({"job_options": {"piority": 1}}, ["Step 'charge'", "unknown job_options key(s): piority"]),
        ({"max_iterations": 3}, ["max_iterations=/max_runtime=", "use @resumable_step"]),
    ],
)
def test_step_option_validation_names_class_step_and_fix(options, fragments):
    with pytest.raises(StepConfigurationError) as info:
        _define(**options)
    message = str(info.value)
    if "job_options" not in options:
        assert "Step 'charge' of DslValidationWorkflow" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_unknown_step_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown option"):
        _define(retries=3)


def test_valid_options_are_accepted_and_stored():
    policy = ExceptionPolicy("cancel")
    cls = _define(
        wait=90,
        wait_for="paid",
        on_exception=policy,
        skip_if="already_done",
        job_options={"queue": "q", "priority": 3},
    )
    definition = cls.steps.named("charge")
    assert definition.wait == timedelta(seconds=90)
    assert isinstance(definition.wait_for, SignalMatcher) and definition.wait_for.name == "paid"
    assert definition.waits_for_signal
    assert definition.exception_policy is policy
    assert definition.on_exception_action == "cancel"
    assert definition.job_options == {"queue": "q", "priority": 3}
    # wait=0 is "present" (Ruby truthiness), not "no wait"
    assert _define(wait=0).steps.named("charge").wait == timedelta(0)


def test_on_exception_reattempt_defaults_to_100_and_explicit_none_is_unlimited():
    assert (
        _define(on_exception="reattempt").steps.named("charge").exception_policy.max_reattempts
        == 100
    )
    unlimited = _define(on_exception="reattempt", max_reattempts=None)
    assert unlimited.steps.named("charge").exception_policy.max_reattempts is None
    capped = _define(on_exception="reattempt!", max_reattempts=4, terminal_action="skip!")
    policy = capped.steps.named("charge").exception_policy
    assert (policy.action, policy.max_reattempts, policy.terminal_action) == (
        "reattempt",
        4,
        "skip",
    )


def test_on_exception_not_given_means_no_step_policy():
    definition = _define().steps.named("charge")
    assert definition.exception_policy is None
    assert definition.on_exception_action is None


def test_resumable_step_option_validation():
    with pytest.raises(
        StepConfigurationError,
        match="Resumable step 'walk' of DslResumableBad has invalid max_iterations",
    ):

        class DslResumableBad(Workflow):
            @resumable_step(max_iterations=0)
            def walk(self, it):
                pass

    with pytest.raises(
        StepConfigurationError, match="invalid max_runtime: must be a positive duration"
    ):

        class DslResumableBad2(Workflow):
            @resumable_step(max_runtime=timedelta(0))
            def walk(self, it):
                pass


def test_step_decorator_misuse_is_a_type_error():
    with pytest.raises(TypeError, match="keyword arguments"):
        step("name")  # positional option
    with pytest.raises(TypeError, match="decorates a function"):
        step(wait=1)(42)


def test_cancel_if_and_class_attribute_validation():
    with pytest.raises(StepConfigurationError, match=r"DslCancelIfBad\.cancel_if has 12"):

        class DslCancelIfBad(Workflow):
            cancel_if = (12,)

            @step
            def a(self):
                pass

    with pytest.raises(StepConfigurationError, match="exception_policies holds 'pause'"):

        class DslPoliciesBad(Workflow):
            exception_policies = ("pause",)

    with pytest.raises(
        StepConfigurationError, match=r"DslJobOptionsBad\.step_job_options has unknown"
    ):

        class DslJobOptionsBad(Workflow):
            step_job_options = {"que": "x"}

    with pytest.raises(
        StepConfigurationError, match="may_proceed_without_hero must be True or False"
    ):

        class DslHeroFlagBad(Workflow):
            may_proceed_without_hero = "yes"


# --- inheritance (copy-on-write) ---------------------------------------------------------


def test_inheritance_accumulates_without_mutating_parents():
    def parent_condition(wf):
        return False

    def child_condition(wf):
        return False

    parent_policy = ExceptionPolicy("cancel", matching=KeyError)
    child_policy = ExceptionPolicy("skip", matching=ValueError)

    class DslParent(Workflow):
        cancel_if = parent_condition
        exception_policies = (parent_policy,)
        step_job_options = {"queue": "parent", "priority": 1}
        may_proceed_without_hero = True

        @step
        def first(self):
            pass

    class DslChild(DslParent):
        cancel_if = (child_condition, "is_voided")
        exception_policies = [child_policy]
        step_job_options = {"priority": 7}

        @step
        def second(self):
            pass

        def is_voided(self):
            return False

    class DslSibling(DslParent):
        @step
        def other(self):
            pass

    assert DslParent.steps.names == ["first"]
    assert DslChild.steps.names == ["first", "second"]
    assert DslSibling.steps.names == ["first", "other"]
    assert DslParent._cancel_conditions == [parent_condition]
    assert DslChild._cancel_conditions == [parent_condition, child_condition, "is_voided"]
    assert DslSibling._cancel_conditions == [parent_condition]
    # a subclass's own policies are consulted before its parents'
    assert DslChild._exception_policies == [child_policy, parent_policy]
    assert DslParent._exception_policies == [parent_policy]
    assert DslChild.class_step_job_options() == {"queue": "parent", "priority": 7}
    assert DslParent.class_step_job_options() == {"queue": "parent", "priority": 1}
    assert DslChild.may_proceed_without_hero is True


def test_subclass_may_override_a_step_body_by_method_name(geneva_session):
    calls = []

    class DslOverrideParent(Workflow):
        @step
        def greet(self):
            calls.append("parent")

    class DslOverrideChild(DslOverrideParent):
        def greet(self):
            calls.append("child")

    speedrun_workflow(DslOverrideChild.create(hero=make_order(geneva_session)))
    speedrun_workflow(DslOverrideParent.create(hero=make_order(geneva_session)))
    assert calls == ["child", "parent"]


# --- add_step ------------------------------------------------------------------------------


def test_add_step_registers_generated_steps_in_order(geneva_session):
    calls = []

    class DslGeneratedWorkflow(Workflow):
        @step
        def start(self):
            calls.append("start")

        def named_method(self):
            calls.append("named_method")

    for region in ("eu", "us"):
        DslGeneratedWorkflow.add_step(
            f"sync_{region}", lambda wf, region=region: calls.append(region)
        )
    DslGeneratedWorkflow.add_step("by_name", "named_method", before_step="sync_eu")
    DslGeneratedWorkflow.add_step("later", lambda wf: calls.append("later"), wait=timedelta(days=1))

    assert DslGeneratedWorkflow.steps.names == ["start", "by_name", "sync_eu", "sync_us", "later"]
    assert DslGeneratedWorkflow.steps.named("later").wait == timedelta(days=1)
    speedrun_workflow(DslGeneratedWorkflow.create(hero=make_order(geneva_session)))
    assert calls == ["start", "named_method", "eu", "us", "later"]


def test_add_step_validates_like_the_decorator():
    class DslAddStepBad(Workflow):
        @step
        def start(self):
            pass

    with pytest.raises(
        StepConfigurationError, match="Step 'start' is already defined in DslAddStepBad"
    ):
        DslAddStepBad.add_step("start", lambda wf: None)
    with pytest.raises(
        StepConfigurationError, match="names method 'missing', which DslAddStepBad does not define"
    ):
        DslAddStepBad.add_step("x", "missing")
    with pytest.raises(StepConfigurationError, match="invalid wait value"):
        DslAddStepBad.add_step("y", lambda wf: None, wait=-1)
    with pytest.raises(TypeError, match="Workflow subclass"):
        Workflow.add_step("z", lambda wf: None)
    assert DslAddStepBad.steps.names == ["start"]


# --- removed_step (gravestones) ------------------------------------------------------------


def test_removed_step_keeps_its_position_but_is_never_runnable():
    class DslGraveWorkflow(Workflow):
        old_first = removed_step()

        @step
        def authorize(self):
            pass

        capture_payment = removed_step()

        @step
        def send_receipt(self):
            pass

        tail = removed_step("renamed_tail")

    steps = DslGraveWorkflow.steps
    assert steps.names == [
        "old_first",
        "authorize",
        "capture_payment",
        "send_receipt",
        "renamed_tail",
    ]
    assert [s.name for s in steps.runnable] == ["authorize", "send_receipt"]
    assert [s.name for s in steps.removed] == ["old_first", "capture_payment", "renamed_tail"]
    assert steps.named("capture_payment").removed
    assert "capture_payment" in steps
    assert steps.next_after(None).name == "authorize"
    assert steps.next_after("authorize").name == "send_receipt"
    assert steps.next_after("capture_payment").name == "send_receipt"
    assert steps.next_after("send_receipt") is None
    assert steps.next_after("unknown") is None
    assert steps.previous_before("send_receipt").name == "authorize"
    assert steps.previous_before("authorize") is None
    assert steps.previous_before("old_first") is None
    assert steps.last().name == "renamed_tail"
    # the gravestone attribute is not left on the class as a callable step
    assert not hasattr(DslGraveWorkflow, "capture_payment")


def test_new_workflow_never_runs_a_gravestone(geneva_session):
    calls = []

    class DslGraveRunWorkflow(Workflow):
        @step
        def authorize(self):
            calls.append("authorize")

        capture_payment = removed_step()

        @step
        def send_receipt(self):
            calls.append("send_receipt")

        trailing = removed_step()

    wf = DslGraveRunWorkflow.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert calls == ["authorize", "send_receipt"]
    assert wf.state == "finished"
    assert [e.step_name for e in wf.execution_history] == ["authorize", "send_receipt"]


def test_removed_step_name_is_validated_like_a_step():
    with pytest.raises(StepConfigurationError, match="Step 'a' is already defined"):

        class DslGraveDup(Workflow):
            @step
            def a(self):
                pass

            b = removed_step("a")
