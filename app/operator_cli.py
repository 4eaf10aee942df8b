"""The dashboard's operator actions on the command line, for runbooks and alert handlers.

::

    geneva-drive workflows list [filters] [--limit N] [--after ID] [--json]
    geneva-drive workflows show ID [--json]
    geneva-drive workflows pause|resume|skip|cancel|reattempt [ID ...] [filters] [--dry-run] [--json]
    geneva-drive workflows resume-at STEP [ID ...] [filters] [--dry-run] [--json]
    geneva-drive signal NAME [ID ...] [filters] [--payload JSON] [--idempotency-key K]
                        [--waiting-only] [--dry-run]
    geneva-drive workers [--json]

Filters are the list page's query parameters (``--class``, ``--state``, ``--hero-type``,
``--hero-id``, ``--step``, ``--error``, ``--due``, ``--stranded``). One implementation with the
dashboard: the selection is :mod:`geneva_drive.dashboard.queries`, the action, its refusals, its
preview and its audit row are :mod:`geneva_drive.operator_actions`, the cap is the dashboard's
``BULK_CAP``. ``--dry-run`` prints the preview (what will be done, what will not be done and
why) and changes nothing. An engine refusal, an unknown id or step, or a selection over the cap
exits 1 with the message on stderr; nothing partial is written for the refused workflow.

No Flask: these commands import neither Flask nor the dashboard's app. They run in a
:class:`Runtime`: ``geneva-drive`` builds its own from the engine's settings
(``GENEVA_DATABASE_URL``, or the embedded default file ``geneva-drive up`` uses; the engine's
Celery client on ``GENEVA_BROKER_URL``), and a host's ``flask geneva …`` passes the host's
database session and Celery app (:func:`geneva_drive.dashboard.cli.register_flask_commands`).

The audit actor is ``cli:<OS user>`` from the process's effective uid (not ``$USER`` or
``$LOGNAME``, which the caller sets); ``--actor NAME`` is recorded beside it, as
``cli:<OS user> as NAME``, so a name given on the command line cannot pose as someone else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pwd
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import db, liveness, operator_actions, transport
from geneva_drive.bootstrap import import_workflow_modules
from geneva_drive.config import process_variable
from geneva_drive.dashboard import presenters, queries, workers
from geneva_drive.dashboard.queries import WorkflowFilters
from geneva_drive.errors import ConfigurationError
from geneva_drive.explain import humanize
from geneva_drive.logsafe import escape
from geneva_drive.models import utcnow
from geneva_drive.workflow import Workflow, workflow_class

#: Exit code of a refusal, an unknown workflow, bad input or a selection over the cap.
REFUSED = 1
#: The dashboard's default ``BULK_CAP`` (app/config.py), for a command run without the app.
DEFAULT_BULK_CAP = 1000
#: What a row says instead of "stranded" when this process cannot know: a paused workflow whose
#: class is not loaded may be stranded on a removed step, or its module was never imported.
UNKNOWN_CLASS = "unknown (set GENEVA_WORKFLOW_MODULES)"

ACTIONS = {
    "pause": "Pause",
    "resume": "Resume",
    "skip": "Skip",
    "cancel": "Cancel",
    "reattempt": "Reattempt",
}
FILTERS = ("class", "state", "hero_type", "hero_id", "step", "error", "due", "stranded")


class Refusal(Exception):
    """Stops a command with a message for the operator (exit 1, nothing changed)."""


# --- where the commands run ----------------------------------------------------------------------


@dataclasses.dataclass
class Runtime:
    """What a command needs from its process: a session on the workflow database, the bulk
    cap, and whether the workflow classes are loaded. Messages go out through the engine's
    transport (the engine's Celery client, or the host's Celery app once registered)."""

    session_scope: Callable[[], AbstractContextManager[Session]]
    bulk_cap: int = DEFAULT_BULK_CAP
    #: False when no workflow module was named: a class not registered here may still exist.
    classes_loaded: bool = True
    #: Said on stderr before the output (e.g. which database file a default picked).
    notice: str = ""


def standalone_runtime() -> Runtime:
    """The ``geneva-drive`` command's own runtime, from the engine's settings alone."""
    modules = import_workflow_modules()
    url, notice = database_url()
    db.configure(url)

    @contextmanager
    def session_scope() -> Iterator[Session]:
        session = db.new_session()
        try:
            yield session
        finally:
            session.close()

    return Runtime(session_scope, _bulk_cap(), classes_loaded=bool(modules), notice=notice)


def database_url() -> tuple[str, str]:
    """``GENEVA_DATABASE_URL``, or the embedded default file that ``geneva-drive up`` uses in
    this directory (``./var/geneva_drive.sqlite3``) when it exists, with a notice naming it."""
    if process_variable("GENEVA_DATABASE_URL"):
        return db.database_url(), ""
    path = Path.cwd() / db.EMBEDDED_DATABASE_PATH
    if path.is_file():
        notice = (
            f"GENEVA_DATABASE_URL is not set: using the embedded default {path} "
            "(the file `geneva-drive up` uses in this directory)."
        )
        return f"sqlite:///{path}", notice
    try:
        return db.database_url(), ""
    except ConfigurationError as error:
        raise ConfigurationError(
            f"{error} No embedded default file at {path} either (run the command where "
            "`geneva-drive up` runs, or set GENEVA_DATABASE_URL)."
        ) from None


def _bulk_cap() -> int:
    raw = process_variable("GENEVA_BULK_CAP")
    if not raw:
        return DEFAULT_BULK_CAP
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ConfigurationError(f"GENEVA_BULK_CAP={raw!r} is not a positive whole number.")
    return cap


#: The runtime factory of the command being run: ``flask geneva`` sets the host's.
RUNTIME: ContextVar[Callable[[], Runtime]] = ContextVar(
    "geneva_cli_runtime", default=standalone_runtime
)


def add_parsers(subparsers: Any) -> None:
    """Add ``workflows`` and ``signal`` to the ``geneva-drive`` subcommands."""
    add_workflows_parser(subparsers)
    add_signal_parser(subparsers)


def add_workflows_parser(subparsers: Any) -> None:
    workflows = subparsers.add_parser(
        "workflows", help="list, show and act on workflows (the dashboard's operator actions)"
    )
    commands = workflows.add_subparsers(dest="workflows_command", required=True)

    listing = commands.add_parser("list", help="workflows matching the filters, newest first")
    _filter_arguments(listing)
    listing.add_argument("--limit", type=int, default=50, help="rows (default 50)")
    listing.add_argument("--after", type=int, help="older than this id (the next page)")
    _json_argument(listing)
    _set(listing, cmd_list)

    show = commands.add_parser("show", help="one workflow: why line, step plan, timeline")
    show.add_argument("id", type=int)
    _json_argument(show)
    _set(show, cmd_show)

    for action, label in ACTIONS.items():
        parser = commands.add_parser(action, help=f"{label} workflows by id or by filter")
        _selection_arguments(parser)
        _set(parser, _action_command(action))

    resume_at = commands.add_parser(
        "resume-at", help="resume paused workflows at STEP (by id or by filter)"
    )
    resume_at.add_argument("target_step", metavar="STEP", help="a step the class runs")
    _selection_arguments(resume_at)
    _set(resume_at, _action_command("resume_at"))


def add_signal_parser(subparsers: Any) -> None:
    signal = subparsers.add_parser("signal", help="deliver signal NAME to workflows")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument("--payload", default="", help="JSON (default {})")
    signal.add_argument("--idempotency-key", default=None)
    signal.add_argument(
        "--waiting-only",
        action="store_true",
        help="deliver only to workflows parked waiting for NAME, refuse the others "
        "(the inbox's bulk deliver); without it a signal is stored until a step waits for it",
    )
    _selection_arguments(signal)
    _set(signal, _action_command("signal"))


def add_workers_parser(subparsers: Any) -> None:
    """``geneva-drive workers``: the dashboard's Workers page as a table (or ``--json``)."""
    listing = subparsers.add_parser(
        "workers",
        help="live workers, and those stopped or expired in the last day, with their running steps",
    )
    _json_argument(listing)
    _set(listing, cmd_workers)


def _set(parser: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
    parser.set_defaults(func=func, handler=func)


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def _filter_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters (as on the dashboard's list)")
    group.add_argument("--class", dest="cls", metavar="CLASS", default="")
    group.add_argument("--state", default="")
    group.add_argument("--hero-type", default="")
    group.add_argument("--hero-id", default="")
    group.add_argument("--step", default="", help="the next step")
    group.add_argument("--error", default="", help="error class of a failed execution")
    group.add_argument("--due", default="", choices=["", "overdue", "waiting", "stuck"])
    group.add_argument("--stranded", default="", help="paused on this removed step")


def _selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", type=int, metavar="ID", help="workflow ids")
    _filter_arguments(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would change; change nothing"
    )
    parser.add_argument(
        "--actor",
        default=None,
        metavar="NAME",
        help='who is acting, recorded beside the OS user ("cli:<user> as NAME")',
    )
    _json_argument(parser)


# --- plumbing ------------------------------------------------------------------------------------


#: Longest ``--actor`` name kept (the audit column holds 255 characters in all).
ACTOR_NAME_LIMIT = 100


def os_user() -> str:
    """The operating-system user of the process's effective uid, from the password database:
    ``$USER`` and ``$LOGNAME`` are set by whoever starts the command, so they prove nothing."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a bare container): the uid is still who it is
        return f"uid{uid}"


def actor(name: str | None = None) -> str:
    """The audit actor: ``cli:<OS user>``, and ``cli:<OS user> as NAME`` with ``--actor``."""
    who = f"cli:{os_user()}"
    if name is None:
        return who
    cleaned = " ".join(name.split())  # no newlines or tabs in an audit row's actor
    if not cleaned:
        raise Refusal("--actor needs a name (or leave it out to act as the OS user).")
    if len(cleaned) > ACTOR_NAME_LIMIT:
        raise Refusal(f"--actor is longer than {ACTOR_NAME_LIMIT} characters.")
    return f"{who} as {cleaned}"


def _filters(args: argparse.Namespace) -> Any:
    values = {name: getattr(args, "cls" if name == "class" else name, "") for name in FILTERS}
    return WorkflowFilters.from_args(values)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, sort_keys=True))


#: Longest database text (an error message, a why line) printed on one line.
TEXT_LIMIT = 2000


def _text(value: Any) -> str:
    """Database text (class, step and signal names, error messages, audit messages) as one
    printable line: a newline, a CR or a terminal escape in it must not forge a row or move
    the cursor (:func:`geneva_drive.logsafe.escape`). JSON output needs none of this."""
    return escape("" if value is None else value, TEXT_LIMIT)


def _fail(message: str, as_json: bool) -> int:
    if as_json:
        _print_json({"ok": False, "error": message})
    sys.stdout.flush()
    print(f"geneva-drive: {_text(message)}", file=sys.stderr)
    return REFUSED


def _note(text: str) -> None:
    """A line for the operator on stderr, after what stdout already holds (same order as in a
    terminal when both go to one pipe)."""
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, body: Callable[[Runtime, Session], int]) -> int:
    try:
        runtime = RUNTIME.get()()
        if runtime.notice:
            _note(f"geneva-drive: {runtime.notice}")
        with runtime.session_scope() as session:
            return body(runtime, session)
    except Refusal as exc:
        return _fail(str(exc), bool(getattr(args, "json", False)))


def _class_unknown(runtime: Runtime, type_name: str) -> bool:
    """This process cannot tell the class's steps: no module named, and it is not registered."""
    return not runtime.classes_loaded and workflow_class(type_name) is None


def _why(runtime: Runtime, row: Any) -> str:
    """The why line; for a class this process cannot see, not the guess "stranded"."""
    if _class_unknown(runtime, row.workflow_class) and row.why.startswith("stranded"):
        return f"{UNKNOWN_CLASS}: {row.workflow_class} is not loaded here"
    return str(row.why)


def _badge_labels(runtime: Runtime, row: Any) -> list[str]:
    labels = [b.label for b in row.badges]
    if _class_unknown(runtime, row.workflow_class):
        labels = [UNKNOWN_CLASS if label == "stranded" else label for label in labels]
    return labels


# --- list and show -------------------------------------------------------------------------------


def _row_dict(runtime: Runtime, row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "class": row.workflow_class,
        "hero_type": row.hero_type,
        "hero_id": row.hero_id,
        "state": row.state,
        "badges": _badge_labels(runtime, row),
        "next_step": row.next_step,
        "why": _why(runtime, row),
        "updated_at": row.updated_at,
    }


def _refuse_unknown_stranded(runtime: Runtime, args: argparse.Namespace) -> None:
    if args.stranded and not runtime.classes_loaded:
        raise Refusal(
            f"--stranded {args.stranded} needs the workflow classes to know which steps are "
            "gone: set GENEVA_WORKFLOW_MODULES to the modules that define them."
        )


def cmd_list(args: argparse.Namespace) -> int:
    def body(runtime: Runtime, session: Session) -> int:
        if args.limit < 1:
            raise Refusal("--limit must be at least 1.")
        _refuse_unknown_stranded(runtime, args)
        stmt = queries.filtered_workflows(_filters(args))
        page = queries.keyset_page(session, stmt, Workflow.id, after=args.after, limit=args.limit)
        rows = presenters.workflow_rows(session, page.items)
        if args.json:
            _print_json({"workflows": [_row_dict(runtime, r) for r in rows], "older": page.older})
            return 0
        for r in rows:
            badges = ",".join(_badge_labels(runtime, r))
            cells = [r.workflow_class, badges, r.next_step or "-", _why(runtime, r)]
            print("\t".join([f"#{r.id}", *(_text(cell) for cell in cells)]))
        if not rows:
            _note("No workflows match.")
        if page.older:
            # A blank line apart from the rows: the cursor is an instruction, not a row.
            _note(f"\nMore: --after {page.older}")
        return 0

    return _run(args, body)


def cmd_show(args: argparse.Namespace) -> int:
    def body(runtime: Runtime, session: Session) -> int:
        workflow = session.get(Workflow, args.id)
        if workflow is None:
            raise Refusal(f"Workflow #{args.id} does not exist.")
        detail = presenters.workflow_detail(session, workflow, None)
        unknown = _class_unknown(runtime, workflow.type)
        if args.json:
            data = dataclasses.asdict(detail)
            data.pop("actions", None)
            data["row"]["badges"] = _badge_labels(runtime, detail.row)
            data["row"]["why"] = _why(runtime, detail.row)
            data["class_loaded"] = not unknown
            _print_json(data)
            return 0
        row = detail.row
        badges = ", ".join(_badge_labels(runtime, row))
        print(f"{_text(row.workflow_class)} #{row.id}  {_text(badges)}")
        print(f"  why:   {_text(_why(runtime, row))}")
        print(f"  hero:  {_text(row.hero_type or '-')} {_text(row.hero_id or '')}".rstrip())
        print(f"  next:  {_text(row.next_step or '-')}")
        if unknown:
            print(f"  plan:  {UNKNOWN_CLASS}: {_text(row.workflow_class)} is not loaded here")
        else:
            print("  plan:  " + "  ".join(f"{_text(s.name)} [{s.status}]" for s in detail.plan))
        print("  timeline:")
        for entry in detail.timeline:
            print(f"    {entry.at:%Y-%m-%d %H:%M:%S} {_text(_timeline_text(entry))}")
        return 0

    return _run(args, body)


def _timeline_text(entry: Any) -> str:
    item = entry.item
    if entry.kind == "execution":
        text = f"{item.step_name} {item.state.label} (attempt {item.attempt}, exec {item.id})"
        return text + (f" {item.error_class}: {item.error_message}" if item.error_class else "")
    if entry.kind == "chain":
        return f"{item.step_name} resumable chain of {len(item.hops)} executions"
    if entry.kind == "signal":
        return f"signal {item.name} {item.state.label}"
    return f"{item.label} by {item.actor}: {item.result} {item.message or ''}".rstrip()


# --- workers -------------------------------------------------------------------------------------

WORKER_COLUMNS = (
    "NAME",
    "STATE",
    "HOST",
    "PID",
    "KIND",
    "QUEUES",
    "CODE VERSION",
    "RUNNING NOW",
    "LAST HEARTBEAT",
    "STARTED",
)


def _worker_cells(row: workers.WorkerRow, view: workers.WorkersView) -> list[str]:
    """One row of the table. Every text from the database goes through ``escape``: a worker
    name or a queue holding a newline or an ANSI escape must not forge rows or move the
    terminal's cursor."""
    state = row.state + (", steps to recover" if row.recovering else "")
    version = escape(row.code_version) + (" (deploy in progress)" if row.other_version else "")
    running = "; ".join(
        f"{escape(s.workflow_class)} #{s.workflow_id} {escape(s.step_name)}"
        + (f" for {humanize(view.age(s.started_at))}" if s.started_at else "")
        for s in row.running
    )
    return [
        escape(row.name),
        state,
        escape(row.hostname),
        str(row.pid),
        escape(row.kind),
        escape(",".join(row.queues)) or "-",
        version,
        running or "-",
        humanize(view.age(row.heartbeat_at)) + " ago",
        f"{row.started_at:%Y-%m-%d %H:%M:%S} UTC",
    ]


def cmd_workers(args: argparse.Namespace) -> int:
    def body(runtime: Runtime, session: Session) -> int:
        view = workers.workers_view(session, utcnow())
        if args.json:
            _print_json(
                {
                    "workers": [workers.as_dict(r, view.taken_at) for r in view.rows],
                    "counts": {s: view.count(s) for s in ("live", "expired", "stopped")},
                    "common_version": view.common_version,
                    "truncated": view.truncated,
                }
            )
            return 0
        if not view.rows:
            _note(
                "No workers have registered in the last day. A worker appears when it starts: "
                "celery -A geneva_drive.celery worker, geneva-drive worker, or geneva-drive up."
            )
            return 0
        table = [list(WORKER_COLUMNS)] + [_worker_cells(r, view) for r in view.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(WORKER_COLUMNS))]
        for line in table:
            print(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(line, widths, strict=True)
                ).rstrip()
            )
        counts = " · ".join(f"{view.count(s)} {s}" for s in ("live", "expired", "stopped"))
        _note(f"\n{counts}")
        if view.recovering:
            _note(
                f"{len(view.recovering)} expired worker(s) still hold running steps: the next "
                'dispatcher sweep recovers them (docs/MANUAL.md, "When a worker dies").'
            )
        if view.other_version:
            _note(
                f"Live workers run {view.live_versions} code versions; most run "
                f"{escape(view.common_version or '')}: a deploy in progress, or a worker a deploy "
                "left behind."
            )
        if view.truncated:
            _note(f"Only the {workers.LIMIT} workers with the latest heartbeats are listed.")
        return 0

    return _run(args, body)


# --- actions -------------------------------------------------------------------------------------


def _selection(runtime: Runtime, session: Session, args: argparse.Namespace) -> list[int]:
    """The ids to act on: the ones named (each must exist), or the filter's (within the cap)."""
    filters = _filters(args)
    if args.ids and not filters.is_empty:
        raise Refusal("Give workflow ids or filters, not both.")
    if args.ids:
        ids = sorted(set(args.ids), reverse=True)
        found = set(session.scalars(select(Workflow.id).where(Workflow.id.in_(ids))))
        missing = [i for i in ids if i not in found]
        if missing:
            listed = ", ".join(f"#{i}" for i in missing)
            raise Refusal(f"No such workflow: {listed}. Nothing was changed.")
        return ids
    if filters.is_empty:
        raise Refusal(
            "Name the workflows: give their ids, or filters (--class, --state, --step, …) "
            "to act on every workflow that matches."
        )
    _refuse_unknown_stranded(runtime, args)
    cap = runtime.bulk_cap
    ids = queries.capped_ids(session, filters, cap)
    if len(ids) > cap:
        raise Refusal(
            f"More than {cap:,} workflows match; narrow the filters (the bulk cap is "
            "GENEVA_BULK_CAP). Nothing was changed."
        )
    return ids


def _params(action: str, args: argparse.Namespace) -> dict[str, Any]:
    if action == "resume_at":
        return {"step": args.target_step}
    if action == "signal":
        try:
            payload = operator_actions.parse_payload(args.payload)
        except ValueError as exc:
            raise Refusal(str(exc).replace("Payload (JSON)", "--payload")) from None
        params = {"name": args.name, "payload": payload, "idempotency_key": args.idempotency_key}
        if args.waiting_only:
            params[operator_actions.WAITING_ONLY] = True
        return params
    return {}


def _label(action: str, args: argparse.Namespace) -> str:
    if action == "resume_at":
        return f"Resume at {args.target_step}"
    if action == "signal":
        return f"Signal {args.name}"
    return ACTIONS[action]


def _check_target_step(runtime: Runtime, session: Session, ids: list[int], step: str) -> None:
    """``resume-at STEP``: every selected workflow's class must run STEP, else the command is a
    typo, refused whole before anything changes, naming the steps there are."""
    types = set(session.scalars(select(Workflow.type).where(Workflow.id.in_(ids)).distinct()))
    for type_name in sorted(types):
        cls = workflow_class(type_name)
        if cls is None:
            if not runtime.classes_loaded:
                raise Refusal(
                    f"Cannot check step `{step}`: {type_name} is not loaded here; set "
                    "GENEVA_WORKFLOW_MODULES to the modules that define the workflow classes. "
                    "Nothing was changed."
                )
            continue  # a class that is gone: the engine refuses each, naming the way out
        definition = cls.steps.named(step)
        if definition is None or definition.removed:
            steps = ", ".join(s.name for s in cls.steps.runnable) or "(none)"
            raise Refusal(
                f"Unknown step `{step}`: {type_name} cannot be resumed at it. Its steps are "
                f"{steps}; run resume-at with one of them. Nothing was changed."
            )


def _action_command(action: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        verb = "signal" if action == "signal" else f"workflows {action.replace('_', '-')}"
        if not args.dry_run:
            # An action schedules steps, whose messages go to the broker: never to one this
            # process was not given (docs/MANUAL.md, "The command line in a host app"). A dry
            # run publishes nothing.
            transport.require_publisher(f"geneva-drive {verb}")

        def act(runtime: Runtime, session: Session) -> int:
            if not args.dry_run:
                # ...and never to a queue no live worker consumes (the host's workers consume
                # their app's default queue, which this Flask-free process cannot see).
                liveness.require_fed_queue(f"geneva-drive {verb}", session)
            return _act(runtime, session, action, args)

        return _run(args, act)

    command.__name__ = f"cmd_{action}"
    return command


def _preview(
    session: Session, action: str, args: argparse.Namespace, ids: list[int], params: Any
) -> int:
    preview = operator_actions.preview_bulk(session, ids, action, params)
    if args.json:
        _print_json(
            {
                "action": action,
                "dry_run": bool(args.dry_run),
                "count": len(preview.eligible),
                "ids": preview.eligible,
                "refused": preview.refused,
                "refused_count": preview.refused_count,
                "gone": preview.gone,
            }
        )
        return 0
    noun = "workflow" if len(preview.eligible) == 1 else "workflows"
    text = f"{_text(_label(action, args))}: {len(preview.eligible):,} {noun} would be changed"
    if preview.not_done:
        # not_done counts refused and gone rows alike: "refused" would miscount the gone.
        text += f", {preview.not_done:,} would not be done ({_text('; '.join(preview.reasons()))})"
    # Without --dry-run this preview is shown only when nothing matched: no "dry run" then.
    print(text + (" (dry run; nothing changed)." if args.dry_run else " (nothing changed)."))
    if preview.eligible:
        print(" ".join(f"#{i}" for i in preview.eligible))
    if preview.refused:
        print("refused: " + " ".join(f"#{i}" for i in preview.refused_ids))
    return 0


def _act(runtime: Runtime, session: Session, action: str, args: argparse.Namespace) -> int:
    who = actor(args.actor)
    ids = _selection(runtime, session, args)
    params = _params(action, args)
    label = _label(action, args)
    if action == "resume_at" and ids:
        _check_target_step(runtime, session, ids, args.target_step)
    if args.dry_run or not ids:
        return _preview(session, action, args, ids, params)
    if len(ids) == 1:
        result = operator_actions.perform(session, who, ids[0], action, params)
        outcome: dict[str, Any] = {
            "action": action,
            "count": 1,
            "done": int(result.ok),
            "refused": int(result.outcome == "refused"),
            "gone": int(result.gone),
            "messages": [f"#{ids[0]}: {result.message}"],
            "batch": None,
        }
    else:
        selection: dict[str, Any] = {"via": "cli"}
        if args.ids:
            selection["ids"] = ids[:100]
        selection["filters"] = _filters(args).as_params()
        bulk = operator_actions.perform_bulk(session, who, ids, action, params, selection)
        outcome = {
            "action": action,
            "count": len(ids),
            "done": bulk.done,
            "refused": bulk.refused,
            "gone": bulk.gone,
            "messages": bulk.messages,
            "batch": bulk.audit_id,
        }
    return report_outcome(label, outcome, as_json=args.json)


def report_outcome(label: str, outcome: dict[str, Any], *, as_json: bool) -> int:
    """Print what an action did; exit 0 only when it did it to every workflow named. A
    workflow deleted meanwhile ("gone") was not done either, so it is not ok."""
    outcome["ok"] = outcome["refused"] == 0 and outcome["gone"] == 0
    if as_json:
        _print_json(outcome)
    else:
        summary = f"{_text(label)}: {outcome['done']} done"
        if outcome["refused"]:
            summary += f", {outcome['refused']} refused"
        if outcome["gone"]:
            summary += f", {outcome['gone']} no longer exist"
        summary += "."
        # The messages name steps and signals from the database, and the engine's refusals
        # quote them: one escaped line each.
        if outcome["ok"]:
            for line in outcome["messages"]:
                print(_text(line))
            print(summary)
        else:
            sys.stdout.flush()
            for line in outcome["messages"]:
                print(_text(line), file=sys.stderr)
            print(summary, file=sys.stderr)
    return 0 if outcome["ok"] else REFUSED
