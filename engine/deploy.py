"""``check-deploy``: the new code's workflow definitions against the live database (docs/MANUAL.md, "Changing workflows in production").

Run it with the *new* code's workflow modules imported (``GENEVA_WORKFLOW_MODULES``), against
the production database, before the deploy. It lists every ongoing workflow the new code
cannot run, grouped by (class, step), each group with its count, one example workflow id and
the fix as a line of Python to paste:

* ``undefined_step``: a scheduled, running or waiting execution names a step the class no
  longer defines (a deploy would strand it). Fix: ``old = renamed_step(to="new")`` or
  ``old = removed_step()``.
* ``stranded``: a paused workflow whose next step the class no longer defines (stranded
  already). Fix: ``resume_at``.
* ``class_not_defined``: ongoing workflows of a class no module defines. Fix: import the
  module, or ``resume_at(..., workflow_class=...)``.
* ``wait_for_changed``: executions parked for a signal the step no longer waits for (they
  parked for ``old``; the step now waits for ``new``, or for nothing).

It also lists the ``removed_step`` and ``renamed_step`` lines that nothing refers to any more
(``drained``: safe to delete). Exit codes for CI: 0 clean, 1 problems found, 2 could not
check. Every query reads the live set only (current executions by their state index, ongoing
workflows by theirs); none grows with finished history.
"""

from __future__ import annotations

import difflib
import json
import keyword
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from geneva_drive import registry
from geneva_drive.errors import ConfigurationError
from geneva_drive.logsafe import escape
from geneva_drive.models import StepExecution
from geneva_drive.signal_matcher import matcher_name
from geneva_drive.states import (
    CURRENT_STEP_STATES,
    ONGOING_WORKFLOW_STATES,
    TERMINAL_WORKFLOW_STATES,
    StepState,
    WorkflowState,
)
from geneva_drive.workflow import Workflow

#: Exit codes of ``geneva-drive check-deploy``.
EXIT_CLEAN, EXIT_PROBLEMS, EXIT_COULD_NOT_CHECK = 0, 1, 2


@dataclass(frozen=True)
class Finding:
    """One group of ongoing workflows the new code cannot run as they are."""

    kind: str
    workflow_class: str
    step: str | None
    count: int
    example_id: int
    problem: str
    #: A line of Python to paste (into the class body, or into a shell on the live database).
    fix: str


@dataclass(frozen=True)
class Drained:
    """A ``removed_step`` / ``renamed_step`` line no ongoing workflow refers to any more."""

    workflow_class: str
    line: str


@dataclass
class DeployReport:
    problems: list[Finding] = field(default_factory=list)
    drained: list[Drained] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_PROBLEMS if self.problems else EXIT_CLEAN

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "problems": [asdict(f) for f in self.problems],
            "drained": [asdict(d) for d in self.drained],
        }


def check(session: Session) -> DeployReport:
    """Compare the registered workflow classes with the ongoing workflows in the database."""
    report = DeployReport()
    report.problems.extend(_current_executions(session))
    report.problems.extend(_unknown_classes(session))
    report.problems.extend(_paused_on_missing_steps(session))
    report.problems.extend(_waits_changed(session))
    report.problems.sort(key=lambda f: (f.workflow_class, f.step or "", f.kind))
    report.drained.extend(_drained(session))
    return report


# --- the rules --------------------------------------------------------------------------------


def _current_executions(session: Session) -> Iterable[Finding]:
    """Scheduled, running and waiting executions of ongoing workflows, per (class, step)."""
    rows = session.execute(
        select(Workflow.type, StepExecution.step_name, func.count(), func.min(Workflow.id))
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state.in_(list(CURRENT_STEP_STATES)),
            Workflow.state.not_in(list(TERMINAL_WORKFLOW_STATES)),
        )
        .group_by(Workflow.type, StepExecution.step_name)
    )
    for type_name, step_name, count, example in rows:
        cls = registry.workflow_class(type_name)
        if cls is None or cls.steps.named(step_name) is not None:
            continue
        guess = _guess(cls, step_name)
        fix = _class_line(
            step_name, f"renamed_step(to={_literal(guess)}" if guess else "removed_step("
        )
        yield Finding(
            kind="undefined_step",
            workflow_class=type_name,
            step=step_name,
            count=int(count),
            example_id=int(example),
            problem=(
                f"{count} execution(s) of ongoing {type_name} workflows are on step "
                f"'{step_name}', which {type_name} no longer defines: after the deploy they "
                "would pause as stranded"
            ),
            fix=f"{fix}  # in the body of class {cls.__name__}"
            + (
                ""
                if guess
                else f" (or {_class_line(step_name, 'renamed_step(to=' + _literal('<its new name>'))})"
            ),
        )


def _unknown_classes(session: Session) -> Iterable[Finding]:
    rows = session.execute(
        select(Workflow.type, func.count(), func.min(Workflow.id))
        # IN, not NOT IN: the (state, id) index serves the ongoing ranges only.
        .where(Workflow.state.in_(sorted(ONGOING_WORKFLOW_STATES)))
        .group_by(Workflow.type)
    )
    for type_name, count, example in rows:
        if registry.workflow_class(type_name) is not None:
            continue
        yield Finding(
            kind="class_not_defined",
            workflow_class=type_name,
            step=None,
            count=int(count),
            example_id=int(example),
            problem=(
                f"{count} ongoing workflow(s) of class {type_name}, which no imported module "
                "defines (GENEVA_WORKFLOW_MODULES), or the new code deleted or renamed"
            ),
            fix=(
                f"add the module that defines {_literal(type_name)} to GENEVA_WORKFLOW_MODULES; if the "
                f"new code renamed the class, keep `workflow_name = {_literal(type_name)}` on it; if it "
                f"deleted it, pause each and session.get(Workflow, {example}).resume_at("
                '"<step>", workflow_class="<new class>")'
            ),
        )


def _paused_on_missing_steps(session: Session) -> Iterable[Finding]:
    """Paused workflows pointing at a step their class no longer defines, with no current
    execution (those with one are counted by :func:`_current_executions`)."""
    current = (
        select(StepExecution.id)
        .where(
            StepExecution.workflow_id == Workflow.id,
            StepExecution.state.in_(list(CURRENT_STEP_STATES)),
        )
        .exists()
    )
    rows = session.execute(
        select(Workflow.type, Workflow.next_step_name, func.count(), func.min(Workflow.id))
        .where(Workflow.state == WorkflowState.PAUSED, ~current)
        .group_by(Workflow.type, Workflow.next_step_name)
    )
    for type_name, step_name, count, example in rows:
        cls = registry.workflow_class(type_name)
        if cls is None or step_name is None or cls.steps.named(step_name) is not None:
            continue
        target = _guess(cls, step_name) or _first_runnable(cls)
        yield Finding(
            kind="stranded",
            workflow_class=type_name,
            step=step_name,
            count=int(count),
            example_id=int(example),
            problem=(
                f"{count} paused {type_name} workflow(s) are stranded on '{step_name}', which "
                f"{type_name} no longer defines"
            ),
            fix=f"session.get(Workflow, {example}).resume_at({_literal(target)})  # for each of them",
        )


def _waits_changed(session: Session) -> Iterable[Finding]:
    """Parked executions whose step now waits for another signal, or for none.

    The signal an execution parked for is in its metadata (``awaiting``, written at the
    gate); executions parked before that was recorded are not judged.
    """
    pairs = session.execute(
        select(Workflow.type, StepExecution.step_name)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(StepExecution.state == StepState.WAITING)
        .group_by(Workflow.type, StepExecution.step_name)
    )
    for type_name, step_name in list(pairs):
        cls = registry.workflow_class(type_name)
        definition = cls.steps.named(step_name) if cls is not None else None
        if definition is None or definition.removed:
            continue
        now_waits = matcher_name(definition.signal_matcher) if definition.wait_for else None
        changed: dict[str, list[int]] = {}
        rows = session.execute(
            select(StepExecution.metadata_, Workflow.id)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.state == StepState.WAITING,
                Workflow.type == type_name,
                StepExecution.step_name == step_name,
            )
        )
        for metadata, workflow_id in rows:
            awaited = (metadata or {}).get("awaiting")
            if awaited is None or awaited == now_waits:
                continue
            if definition.wait_for is not None and now_waits is None:
                continue  # a custom matcher without a name: nothing to compare
            seen = changed.setdefault(str(awaited), [0, int(workflow_id)])
            seen[0] += 1
            seen[1] = min(seen[1], int(workflow_id))
        for awaited, (count, example) in sorted(changed.items()):
            yield _wait_finding(type_name, step_name, awaited, now_waits, count, example)


def _wait_finding(
    type_name: str, step: str, awaited: str, now_waits: str | None, count: int, example: int
) -> Finding:
    if now_waits is None:
        problem = (
            f"{count} execution(s) parked on '{step}' wait for signal '{awaited}', but the new "
            f"code's '{step}' waits for no signal: they would run without it"
        )
    else:
        problem = (
            f"{count} execution(s) parked on '{step}' wait for signal '{awaited}', but the new "
            f"code's '{step}' waits for '{now_waits}': a '{awaited}' signal would no longer "
            "wake them"
        )
    return Finding(
        kind="wait_for_changed",
        workflow_class=type_name,
        step=step,
        count=count,
        example_id=example,
        problem=problem,
        fix=(
            f"@step(wait_for={_literal(awaited)})  # keep the old wait_for of {_literal(step)} until these "
            "drain; change it in a later deploy"
        ),
    )


def _drained(session: Session) -> Iterable[Drained]:
    for name, cls in sorted(registry.registered_workflows().items()):
        if name != cls.workflow_name:
            continue
        in_flight = cls.removed_steps_in_flight(session)
        for gravestone in cls.steps.removed:
            if not in_flight.get(gravestone.name):
                yield Drained(name, _class_line(gravestone.name, "removed_step("))
        for old, count in cls.renamed_steps_in_flight(session).items():
            if not count:
                yield Drained(
                    name, _class_line(old, f"renamed_step(to={_literal(cls.steps.renamed[old])}")
                )


def _guess(cls: type[Workflow], step_name: str) -> str | None:
    """The runnable step a deleted step was most likely renamed to (difflib), if any."""
    names = [s.name for s in cls.steps.runnable]
    close = difflib.get_close_matches(step_name, names, n=1, cutoff=0.6)
    if close:
        return close[0]
    containing = [n for n in names if step_name in n or n in step_name]
    return containing[0] if len(containing) == 1 else None


def _literal(text: str) -> str:
    """``repr(text)``, in double quotes when the text holds none (as the manual writes them):
    a Python literal whatever the stored name holds, escapes and all."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def _class_line(step_name: str, call: str) -> str:
    """A line of a class body naming ``step_name``: ``capture = removed_step()``, or, for a
    stored name that is not a Python identifier, the name passed as a quoted argument (never
    pasted raw into code: a name holding quotes or a newline must not become code)."""
    if step_name.isidentifier() and not keyword.iskeyword(step_name):
        return f"{step_name} = {call})"
    separator = "" if call.endswith("(") else ", "
    return f"old_step = {call}{separator}name={_literal(step_name)})"


def _first_runnable(cls: type[Workflow]) -> str:
    first = cls.steps.next_after(None)
    return first.name if first is not None else "<step>"


# --- output -----------------------------------------------------------------------------------


#: Longest problem or fix text printed (they name a class, a step and a signal at most).
_TEXT_LIMIT = 2000


def render(report: DeployReport, as_json: bool = False) -> str:
    """The report as text for a terminal (or JSON for scripts)."""
    if as_json:
        return json.dumps(report.as_dict(), indent=2, sort_keys=True)
    lines: list[str] = []
    if not report.problems:
        lines.append("check-deploy: OK - the new code can run every ongoing workflow.")
    else:
        lines.append(
            f"check-deploy: {len(report.problems)} problem(s) - deploying this code would "
            "strand or wedge ongoing workflows:"
        )
        for f in report.problems:
            # Class, step and signal names come from the database: escaped, so a name holding
            # a newline or a terminal escape cannot forge a line or move the cursor. The fix
            # is code, built with repr() of every such name: printable, and kept pasteable.
            where = escape(f"{f.workflow_class}.{f.step}" if f.step else f.workflow_class)
            lines.append("")
            lines.append(f"  [{f.kind}] {where}: {f.count} (e.g. workflow #{f.example_id})")
            lines.append(f"    {escape(f.problem, _TEXT_LIMIT)}")
            fix = f.fix if f.fix.isprintable() else escape(f.fix, _TEXT_LIMIT)
            lines.append(f"    fix: {fix}")
    if report.drained:
        lines.append("")
        lines.append("Drained (nothing refers to them any more; safe to delete the line):")
        lines.extend(f"  {escape(d.workflow_class)}: {escape(d.line)}" for d in report.drained)
    return "\n".join(lines)


def run(session: Session, as_json: bool = False) -> int:
    """``geneva-drive check-deploy``: check on ``session``, print the report; the exit code.

    The caller has imported the new code's workflow modules. Anything that stops the check
    itself (no workflow class registered, the database not answering) prints why on stderr
    and returns 2, so a CI step can tell "the deploy is unsafe" from "the check did not run".
    """
    try:
        if not registry.registered_workflows():
            raise ConfigurationError(
                "no workflow class is registered: set GENEVA_WORKFLOW_MODULES to the new code's "
                "workflow modules"
            )
        report = check(session)
    except (ConfigurationError, SQLAlchemyError) as error:
        print(f"check-deploy: could not check: {error}", file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    print(render(report, as_json=as_json))
    return report.exit_code


__all__ = [
    "EXIT_CLEAN",
    "EXIT_COULD_NOT_CHECK",
    "EXIT_PROBLEMS",
    "DeployReport",
    "Drained",
    "Finding",
    "check",
    "render",
    "run",
]
