"""Exception policies (docs/MANUAL.md, "Exception policies"):
step-level forms, class-level resolution, the default pause, max_reattempts and the
consecutive-reattempt count, the global cap, terminal actions, reporting, and error columns."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import ExceptionPolicy, Workflow, step
from geneva_drive.errors import StepConfigurationError
from geneva_drive.executor import consecutive_reattempt_count
from geneva_drive.instrumentation import set_error_reporter
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.policies import CombinedExceptionPolicy, LazyExceptionMatcher, resolution_stack
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import assert_close, assert_recent, executions, make_order, summary


class PaymentDeclined(Exception):
    pass


class CardExpired(PaymentDeclined):
    pass


class GatewayTimeout(Exception):
    pass


@pytest.fixture
def reported():
    errors: list[tuple[BaseException, dict]] = []
    set_error_reporter(lambda error, context: errors.append((error, context)))
    yield errors
    set_error_reporter(None)


def _failing(name, error_factory, *, after=True, **step_options):
    """A workflow class whose first step raises ``error_factory()`` each time it runs."""
    attrs = {
        "calls": [],
        "first": step(**step_options)(
            lambda self: (type(self).calls.append("first"), _raise(error_factory()))
        ),
    }
    if after:
        attrs["after"] = step(lambda self: type(self).calls.append("after"))
    return type(name, (Workflow,), attrs)


def _raise(error):
    raise error


def _run_failing(workflow, times, error_cls=Exception):
    for _ in range(times):
        with pytest.raises(error_cls):
            perform_next_step(workflow)


# --- step-level string forms ----------------------------------------------------------------


def test_default_policy_pauses_with_error_columns(geneva_session, reported):
    cls = _failing("PolDefault", lambda: PaymentDeclined("card declined"))
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("failed", "failed")
    assert_recent(ex.failed_at)
    assert ex.error_class_name == f"{__name__}.PaymentDeclined"
    assert ex.error_message == "card declined"
    assert "Traceback (most recent call last)" in ex.error_backtrace
    assert "_raise" in ex.error_backtrace
    assert "PaymentDeclined: card declined" in ex.error_backtrace
    meta = ex.metadata_["exception"]
    assert meta["class"] == ex.error_class_name and meta["message"] == "card declined"
    assert meta["backtrace"] == ex.error_backtrace.split("\n")
    assert wf.state == "paused"
    assert_recent(wf.transitioned_at)
    assert len(reported) == 1


def test_builtin_error_class_name_is_unqualified(geneva_session):
    cls = _failing("PolBuiltin", lambda: KeyError("k"))
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, KeyError)
    assert executions(geneva_session, wf)[0].error_class_name == "KeyError"


def test_on_exception_cancel(geneva_session):
    cls = _failing("PolCancel", lambda: PaymentDeclined("no"), on_exception="cancel")
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("failed", "canceled")
    assert ex.error_message == "no" and ex.error_class_name.endswith("PaymentDeclined")
    assert wf.state == "canceled"


def test_on_exception_skip_stores_no_error_and_moves_on(geneva_session):
    cls = _failing("PolSkip", lambda: PaymentDeclined("no"), on_exception="skip!")
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    assert summary(geneva_session, wf) == [
        ("first", "skipped", "skipped"),
        ("after", "scheduled", None),
    ]
    ex = executions(geneva_session, wf)[0]
    assert ex.error_message is None and ex.error_class_name is None
    assert wf.state == "ready"


def test_on_exception_reattempt_records_metadata_not_error_columns(geneva_session):
    cls = _failing("PolReattempt", lambda: GatewayTimeout("slow"), on_exception="reattempt")
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, GatewayTimeout)
    first, again = executions(geneva_session, wf)
    assert (first.state, first.outcome) == ("completed", "reattempted")
    assert first.error_message is None and first.error_class_name is None
    assert first.metadata_["reattempt_reason"] == "exception_policy"
    assert first.metadata_["exception"]["message"] == "slow"
    assert first.metadata_["exception"]["class"].endswith("GatewayTimeout")
    assert (again.step_name, again.state) == ("first", "scheduled")
    assert_recent(again.scheduled_for)  # the symbol form has no wait
    assert wf.state == "ready"


def test_max_reattempts_then_terminal_pause(geneva_session):
    cls = _failing(
        "PolMax3", lambda: GatewayTimeout("t"), on_exception="reattempt", max_reattempts=3
    )
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 4, GatewayTimeout)
    assert [e.outcome for e in executions(geneva_session, wf)] == [
        "reattempted",
        "reattempted",
        "reattempted",
        "failed",
    ]
    assert wf.state == "paused"
    assert perform_next_step(wf) is None  # nothing left scheduled


@pytest.mark.parametrize(
    ("terminal", "workflow_state", "last"),
    [
        ("cancel", "canceled", ("first", "failed", "canceled")),
        ("skip", "ready", ("after", "scheduled", None)),
        ("pause!", "paused", ("first", "failed", "failed")),
    ],
)
def test_terminal_action(geneva_session, terminal, workflow_state, last):
    cls = _failing(
        f"PolTerminal_{terminal.strip('!')}",
        lambda: GatewayTimeout("t"),
        on_exception="reattempt",
        max_reattempts=1,
        terminal_action=terminal,
    )
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 2, GatewayTimeout)
    assert wf.state == workflow_state
    assert summary(geneva_session, wf)[-1] == last


def test_default_max_reattempts_is_100(geneva_session):
    cls = _failing("PolDefault100", lambda: GatewayTimeout("t"), on_exception="reattempt")
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 101, GatewayTimeout)
    rows = executions(geneva_session, wf)
    assert len(rows) == 101
    assert [e.outcome for e in rows].count("reattempted") == 100
    assert rows[-1].outcome == "failed" and wf.state == "paused"


def test_earlier_reattempts_still_count_after_pause_and_resume(geneva_session):
    cls = _failing(
        "PolCountResume", lambda: GatewayTimeout("t"), on_exception="reattempt", max_reattempts=2
    )
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 3, GatewayTimeout)
    assert wf.state == "paused"
    wf.resume()
    _run_failing(wf, 1, GatewayTimeout)
    # failed rows do not reset the count: the first failure after resume pauses again
    assert [e.outcome for e in executions(geneva_session, wf)] == [
        "reattempted",
        "reattempted",
        "failed",
        "failed",
    ]
    assert wf.state == "paused"


def test_flow_control_reattempts_are_not_counted(geneva_session):
    runs = []

    class PolFlowNotCounted(Workflow):
        @step(on_exception="reattempt", max_reattempts=1)
        def first(self):
            runs.append(1)
            if len(runs) <= 4:
                self.reattempt()
            raise GatewayTimeout("now it fails")

    wf = PolFlowNotCounted.create(hero=make_order(geneva_session))
    for _ in range(4):
        perform_next_step(wf)
    _run_failing(wf, 2, GatewayTimeout)
    outcomes = [e.outcome for e in executions(geneva_session, wf)]
    assert outcomes == ["reattempted"] * 5 + ["failed"]
    assert [e.metadata_["reattempt_reason"] for e in executions(geneva_session, wf)[:5]] == [
        "flow_control"
    ] * 4 + ["exception_policy"]
    assert wf.state == "paused"


def test_consecutive_reattempt_count_rules(geneva_session):
    class PolCountRows(Workflow):
        @step
        def s(self):
            pass

    wf = PolCountRows.create(hero=make_order(geneva_session))
    geneva_session.flush()
    now = utcnow()

    def row(outcome, state="completed", reason="exception_policy", name="s"):
        metadata = {"reattempt_reason": reason} if reason is not None else None
        ex = StepExecution(
            workflow_id=wf.id,
            step_name=name,
            state=state,
            outcome=outcome,
            scheduled_for=now,
            metadata_=metadata,
        )
        geneva_session.add(ex)
        geneva_session.flush()

    def count():
        return consecutive_reattempt_count(geneva_session, wf, "s")

    # the scheduled first execution exists already
    assert count() == 0
    row("reattempted")
    row("reattempted", reason="precondition")
    row("reattempted", reason=None)  # rows without a reason count
    row("reattempted", reason="flow_control")  # never counted
    row("reattempted", name="other")  # another step
    assert count() == 3
    row("failed", state="failed")
    row("skipped", state="skipped")
    row("canceled", state="canceled")
    assert count() == 3  # failed, skipped, canceled do not reset
    row("success")
    assert count() == 0  # a clean completion resets
    row("reattempted")
    assert count() == 1
    row("continued")
    assert count() == 0


# --- ExceptionPolicy objects, lists and callables at step level -------------------------------


def test_policy_object_with_wait_and_matching(geneva_session):
    policy = ExceptionPolicy(
        "reattempt", matching=GatewayTimeout, wait=timedelta(minutes=5), max_reattempts=2
    )
    cls = _failing("PolObjectWait", lambda: GatewayTimeout("t"), on_exception=policy)
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, GatewayTimeout)
    again = executions(geneva_session, wf)[-1]
    assert_close(again.scheduled_for, utcnow() + timedelta(minutes=5))


def test_policy_that_does_not_match_falls_through_to_default_pause(geneva_session):
    policy = ExceptionPolicy("skip", matching=GatewayTimeout)
    cls = _failing("PolNoMatch", lambda: PaymentDeclined("x"), on_exception=policy)
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    assert wf.state == "paused"


def test_matchers_class_subclass_dotted_string_callable_and_unknown_name():
    assert ExceptionPolicy("skip", matching=PaymentDeclined).captures(CardExpired())
    assert not ExceptionPolicy("skip", matching=CardExpired).captures(PaymentDeclined())
    lazy = ExceptionPolicy("skip", matching=f"{__name__}.PaymentDeclined")
    assert isinstance(lazy.exception_matchers[0], LazyExceptionMatcher)
    assert lazy.captures(CardExpired()) and not lazy.captures(GatewayTimeout())
    assert ExceptionPolicy("skip", matching="KeyError").captures(KeyError())
    unknown = ExceptionPolicy("skip", matching="no.such.module.Error")
    assert not unknown.captures(KeyError())  # never raises, never matches
    by_message = ExceptionPolicy("skip", matching=lambda e: "timeout" in str(e))
    assert by_message.captures(RuntimeError("gateway timeout"))
    assert not by_message.captures(RuntimeError("other"))
    several = ExceptionPolicy("skip", matching=[KeyError, "ValueError"])
    assert several.captures(ValueError()) and several.captures(KeyError())
    assert not several.captures(TypeError())
    blanket = ExceptionPolicy("pause")
    assert blanket.is_blanket and not blanket.is_specific and blanket.captures(TypeError())


def test_step_level_list_uses_the_first_match_in_list_order(geneva_session):
    policies = [
        ExceptionPolicy("cancel", matching=CardExpired),
        ExceptionPolicy("skip", matching=PaymentDeclined),
    ]
    a = _failing("PolListA", lambda: CardExpired("x"), on_exception=policies)
    b = _failing("PolListB", lambda: PaymentDeclined("x"), on_exception=policies)
    c = _failing("PolListC", lambda: GatewayTimeout("x"), on_exception=policies)
    wa, wb, wc = (k.create(hero=make_order(geneva_session)) for k in (a, b, c))
    _run_failing(wa, 1, CardExpired)
    _run_failing(wb, 1, PaymentDeclined)
    _run_failing(wc, 1, GatewayTimeout)
    assert (wa.state, wb.state, wc.state) == ("canceled", "ready", "paused")
    # single pass in list order: a blanket listed first wins even over a later specific one
    combined = CombinedExceptionPolicy(
        [
            ExceptionPolicy("reattempt", matching=Exception),
            ExceptionPolicy("cancel", matching=KeyError),
        ]
    )
    assert combined.apply(KeyError(), 0, None).action == "reattempt"


@pytest.mark.parametrize(
    ("handler_action", "state", "last"),
    [
        ("skip", "ready", ("after", "scheduled", None)),
        ("cancel", "canceled", ("first", "failed", "canceled")),
        ("pause", "paused", ("first", "failed", "failed")),
        ("finish", "finished", ("first", "completed", "success")),
        ("reattempt", "ready", ("first", "scheduled", None)),
        ("nothing", "paused", ("first", "failed", "failed")),
    ],
)
def test_callable_handler_decides_by_flow_control(geneva_session, handler_action, state, last):
    seen = []

    def handler(workflow, error):
        seen.append(str(error))
        if handler_action == "reattempt":
            workflow.reattempt(wait=timedelta(minutes=3))
        elif handler_action == "finish":
            workflow.finish()
        elif handler_action != "nothing":
            getattr(workflow, handler_action)()

    cls = _failing(
        f"PolHandler_{handler_action}", lambda: PaymentDeclined("boom"), on_exception=handler
    )
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    assert seen == ["boom"]
    assert wf.state == state
    assert summary(geneva_session, wf)[-1] == last
    if handler_action == "reattempt":
        assert_close(
            executions(geneva_session, wf)[-1].scheduled_for, utcnow() + timedelta(minutes=3)
        )


def test_handler_during_precondition_decides_the_outcome(geneva_session):
    """Deliberate difference: the gem ran operator verbs here; ours end the handling."""

    class PolPreconditionHandler(Workflow):
        @step(skip_if="explode", on_exception=lambda wf, e: wf.cancel())
        def first(self):
            pass

        def explode(self):
            raise PaymentDeclined("in skip_if")

    wf = PolPreconditionHandler.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, PaymentDeclined)
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("first", "failed", "canceled")]


# --- class-level policies ---------------------------------------------------------------------


def test_class_level_specific_beats_blanket_regardless_of_order(geneva_session):
    class PolClassLevel(Workflow):
        exception_policies = (
            ExceptionPolicy("skip", matching=PaymentDeclined),
            ExceptionPolicy("cancel"),  # blanket, declared later
        )

        @step
        def first(self):
            raise type(self).error

        @step
        def after(self):
            pass

    PolClassLevel.error = CardExpired("x")
    wf = PolClassLevel.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, CardExpired)
    assert wf.state == "ready"  # skip, not cancel

    PolClassLevel.error = GatewayTimeout("x")
    wf2 = PolClassLevel.create(hero=make_order(geneva_session))
    _run_failing(wf2, 1, GatewayTimeout)
    assert wf2.state == "canceled"  # only the blanket matched


def test_step_level_beats_class_level_and_subclass_beats_parent(geneva_session):
    class PolParent(Workflow):
        exception_policies = (ExceptionPolicy("cancel", matching=PaymentDeclined),)

        @step
        def first(self):
            raise PaymentDeclined("x")

    class PolChild(PolParent):
        exception_policies = (ExceptionPolicy("skip", matching=PaymentDeclined),)

    class PolStepWins(Workflow):
        exception_policies = (ExceptionPolicy("cancel"),)

        @step(on_exception="pause")
        def first(self):
            raise PaymentDeclined("x")

    p, c, s = (
        k.create(hero=make_order(geneva_session)) for k in (PolParent, PolChild, PolStepWins)
    )
    for wf in (p, c, s):
        _run_failing(wf, 1, PaymentDeclined)
    assert p.state == "canceled"
    assert c.state == "finished"  # child's skip, and there is no next step
    assert s.state == "paused"


def test_class_level_blanket_newest_first_and_resolve_helper():
    first = ExceptionPolicy("cancel")
    second = ExceptionPolicy("skip")
    specific = ExceptionPolicy("reattempt", matching=KeyError)

    class PolResolveParent(Workflow):
        exception_policies = (first, specific)

    class PolResolveChild(PolResolveParent):
        exception_policies = (second,)

    assert PolResolveChild.resolve_exception_policy(KeyError()) is specific
    assert PolResolveChild.resolve_exception_policy(ValueError()) is second
    assert PolResolveParent.resolve_exception_policy(ValueError()) is first
    stack = resolution_stack(None, PolResolveChild._exception_policies)
    assert stack.apply(ValueError("x"), 0, None).action == "skip"
    assert stack.apply(KeyError("x"), 0, None).action == "reattempt"


def test_class_level_reattempt_has_no_default_cap():
    assert ExceptionPolicy("reattempt").max_reattempts is None
    stack = resolution_stack(None, [ExceptionPolicy("reattempt")])
    assert stack.max_reattempts is None
    assert stack.apply(ValueError(), 10_000, None).action == "reattempt"


def test_global_cap_is_the_minimum_over_the_whole_stack(geneva_session):
    class PolGlobalCap(Workflow):
        exception_policies = (ExceptionPolicy("reattempt", matching=KeyError, max_reattempts=2),)

        @step(on_exception="reattempt", terminal_action="cancel")  # 100 by default
        def first(self):
            raise GatewayTimeout("t")

    wf = PolGlobalCap.create(hero=make_order(geneva_session))
    _run_failing(wf, 3, GatewayTimeout)
    # the class-level cap of 2 also caps the step-level policy; the matched leaf's terminal applies
    assert [e.outcome for e in executions(geneva_session, wf)] == [
        "reattempted",
        "reattempted",
        "canceled",
    ]
    assert wf.state == "canceled"


def test_global_cap_with_a_nested_list_uses_the_matched_leafs_terminal_action():
    inner = CombinedExceptionPolicy(
        [ExceptionPolicy("reattempt", matching=KeyError, terminal_action="skip")]
    )
    outer = CombinedExceptionPolicy(
        [inner, ExceptionPolicy("reattempt", matching=ValueError, max_reattempts=1)]
    )
    result = outer.apply(KeyError(), 1, None)
    assert (result.action, result.terminal) == ("skip", True)
    assert outer.apply(KeyError(), 0, None).action == "reattempt"


# --- reporting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "expected_reports"),
    [("always", 3), ("never", 0), ("terminal_only", 1)],
)
def test_report_modes(geneva_session, reported, report, expected_reports):
    policy = ExceptionPolicy("reattempt", max_reattempts=2, report=report)
    cls = _failing(f"PolReport_{report}", lambda: GatewayTimeout("t"), on_exception=policy)
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 3, GatewayTimeout)  # reattempt, reattempt, terminal pause
    assert wf.state == "paused"
    assert len(reported) == expected_reports
    assert all(isinstance(error, GatewayTimeout) for error, _ in reported)


def test_imperative_policy_with_terminal_only_never_reports(geneva_session, reported):
    policy = ExceptionPolicy(handler=lambda wf, e: wf.cancel(), report="terminal_only")
    cls = _failing("PolImperativeTerminalOnly", lambda: GatewayTimeout("t"), on_exception=policy)
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, GatewayTimeout)
    assert wf.state == "canceled"
    assert reported == []


def test_reporter_receives_context(geneva_session, reported):
    cls = _failing("PolReportContext", lambda: GatewayTimeout("t"))
    order = make_order(geneva_session)
    wf = cls.create(hero=order)
    _run_failing(wf, 1, GatewayTimeout)
    [(error, context)] = reported
    assert isinstance(error, GatewayTimeout)
    ex = executions(geneva_session, wf)[0]
    assert context == {
        "workflow_id": wf.id,
        "workflow_class": "PolReportContext",
        "step_execution_id": ex.id,
        "step_name": "first",
        "hero_type": "Order",
        "hero_id": str(order.id),
    }


def test_a_broken_reporter_does_not_change_the_outcome(geneva_session):
    def broken(error, context):
        raise RuntimeError("reporter down")

    set_error_reporter(broken)
    try:
        cls = _failing("PolBrokenReporter", lambda: GatewayTimeout("t"), on_exception="skip")
        wf = cls.create(hero=make_order(geneva_session))
        _run_failing(wf, 1, GatewayTimeout)
        assert wf.state == "ready"
    finally:
        set_error_reporter(None)


def test_exception_is_always_reraised_even_when_never_reported(geneva_session, reported):
    policy = ExceptionPolicy("skip", report="never")
    cls = _failing("PolNeverReported", lambda: GatewayTimeout("t"), on_exception=policy)
    wf = cls.create(hero=make_order(geneva_session))
    _run_failing(wf, 1, GatewayTimeout)
    assert reported == []


# --- ExceptionPolicy validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {"report": "sometimes"}, "report: must be one of always, never, terminal_only"),
        ((), {}, "Either an action or a handler is required"),
        (
            ("explode",),
            {},
            "Invalid action 'explode': must be one of pause, cancel, reattempt, skip",
        ),
        (("pause",), {"wait": 5}, 'wait= only makes sense with action "reattempt"'),
        (
            ("cancel",),
            {"max_reattempts": 2},
            'max_reattempts= only makes sense with action "reattempt"',
        ),
        (
            ("reattempt",),
            {"max_reattempts": 0},
            "max_reattempts= must be a positive integer or None",
        ),
        (
            ("reattempt",),
            {"terminal_action": "reattempt"},
            "terminal_action= must be one of pause, cancel, skip",
        ),
        (
            ("skip",),
            {"terminal_action": "cancel"},
            'terminal_action= only makes sense with action "reattempt"',
        ),
        (
            ("skip",),
            {"handler": lambda wf, e: None},
            "Cannot pass action, wait, max_reattempts, or terminal_action",
        ),
        ((), {"handler": lambda wf, e: None, "wait": 3}, "Cannot pass action, wait"),
        (("skip",), {"matching": int}, "Expected an Exception subclass, got int"),
        (("skip",), {"matching": 42}, "Expected an exception matcher"),
    ],
)
def test_exception_policy_validation(args, kwargs, message):
    with pytest.raises(ValueError) as info:
        ExceptionPolicy(*args, **kwargs)
    assert message in str(info.value)


def test_exception_policy_accepts_the_gems_bang_spelling():
    policy = ExceptionPolicy("reattempt!", max_reattempts=3, terminal_action="cancel!")
    assert (policy.action, policy.terminal_action) == ("reattempt", "cancel")
    assert policy.apply(ValueError(), 3, None).action == "cancel"
    assert policy.apply(ValueError(), 2, None).action == "reattempt"


def test_class_level_policy_list_must_hold_policies():
    with pytest.raises(StepConfigurationError, match="every entry must be an ExceptionPolicy"):

        class PolBadClassPolicies(Workflow):
            exception_policies = (ExceptionPolicy("pause"), lambda wf, e: None)


# --- a handler that itself raises -----------------------------------------------------------------


def test_a_raising_handler_pauses_instead_of_leaving_the_step_in_progress(geneva_session, reported):
    """Deliberate difference: the gem let the handler's error escape, rolling the outcome back
    and leaving the step in_progress; we pause and keep the handler's error as a note."""

    def buggy(workflow, error):
        raise RuntimeError("handler bug")

    cls = _failing("PolBuggyHandler", lambda: PaymentDeclined("original"), on_exception=buggy)
    wf = cls.create(hero=make_order(geneva_session))
    with pytest.raises(PaymentDeclined, match="original") as info:
        perform_next_step(wf)
    assert "The exception handler raised RuntimeError: handler bug" in info.value.__notes__
    assert wf.state == "paused"
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("failed", "failed")
    assert ex.error_message == "original"
    assert len(reported) == 1


def test_a_raising_handler_in_a_precondition_also_pauses(geneva_session):
    def buggy(workflow, error):
        raise RuntimeError("handler bug")

    class PolBuggyPrecondition(Workflow):
        @step(skip_if="explode", on_exception=buggy)
        def first(self):
            pass

        def explode(self):
            raise PaymentDeclined("in skip_if")

    wf = PolBuggyPrecondition.create(hero=make_order(geneva_session))
    with pytest.raises(PaymentDeclined):
        perform_next_step(wf)
    assert wf.state == "paused"
    assert summary(geneva_session, wf) == [("first", "failed", "failed")]
