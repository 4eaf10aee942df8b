"""The dashboard's operator actions on the command line, for runbooks and alert handlers.

::

    geneva-drive workflows list [filters] [--limit N] [--after ID] [--json]
    geneva-drive workflows show ID [--json]
    geneva-drive workflows pause|resume|skip|cancel|reattempt [ID ...] [filters] [--dry-run] [--json]
    geneva-drive workflows resume-at STEP [ID ...] [filters] [--dry-run] [--json]
    geneva-drive signal NAME [ID ...] [filters] [--payload JSON] [--idempotency-key K] [--dry-run]

Filters are the list page's query parameters (``--class``, ``--state``, ``--hero-type``,
``--hero-id``, ``--step``, ``--error``, ``--due``, ``--stranded``). One implementation with the
dashboard: the selection is :mod:`geneva_drive.dashboard.queries`, the action and its audit
row are :mod:`geneva_drive.dashboard.operator_actions` (actor ``cli:<user>``), the cap is the
dashboard's ``BULK_CAP``. ``--dry-run`` prints the preview and changes nothing. An engine
refusal, an unknown id or a selection over the cap exits 1 with the message on stderr;
nothing partial is written for the refused workflow.

The lead wires :func:`add_parsers` into the ``geneva-drive`` parser; each parser sets
``func`` (and ``handler``, the name ``engine/cli.py`` dispatches on) to a function taking the
parsed arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flask import current_app
from sqlalchemy import select

from geneva_drive.dashboard import create_app, operator_actions, presenters, queries
from geneva_drive.dashboard.extensions import db
from geneva_drive.dashboard.queries import WorkflowFilters
from geneva_drive.workflow import Workflow

#: Exit code of a refusal, an unknown workflow, bad input or a selection over the cap.
REFUSED = 1

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


def add_parsers(subparsers: Any) -> None:
    """Add ``workflows`` and ``signal`` to the ``geneva-drive`` subcommands."""
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

    signal = subparsers.add_parser("signal", help="deliver signal NAME to workflows")
    signal.add_argument("name", metavar="NAME")
    signal.add_argument("--payload", default="", help="JSON (default {})")
    signal.add_argument("--idempotency-key", default=None)
    _selection_arguments(signal)
    _set(signal, _action_command("signal"))


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
    _json_argument(parser)


# --- plumbing ------------------------------------------------------------------------------------


def actor() -> str:
    """The audit actor: ``cli:`` and the operating-system user running the command."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (a bare container)
        user = f"uid{os.getuid()}"
    return f"cli:{user}"


@contextmanager
def _dashboard() -> Iterator[Any]:
    """The dashboard app's context on the configured database (``GENEVA_DATABASE_URL``)."""
    # No session is signed here: the command needs no secret key.
    app = create_app(require_secret_key=False)
    with app.app_context():
        try:
            yield app
        finally:
            db.session.remove()


def _filters(args: argparse.Namespace) -> Any:

    values = {name: getattr(args, "cls" if name == "class" else name, "") for name in FILTERS}
    return WorkflowFilters.from_args(values)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, sort_keys=True))


def _fail(message: str, as_json: bool) -> int:
    if as_json:
        _print_json({"ok": False, "error": message})
    print(f"geneva-drive: {message}", file=sys.stderr)
    return REFUSED


def _run(args: argparse.Namespace, body: Callable[[], int]) -> int:
    try:
        with _dashboard():
            return body()
    except Refusal as exc:
        return _fail(str(exc), bool(getattr(args, "json", False)))


# --- list and show -------------------------------------------------------------------------------


def _row_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "class": row.workflow_class,
        "hero_type": row.hero_type,
        "hero_id": row.hero_id,
        "state": row.state,
        "badges": [b.label for b in row.badges],
        "next_step": row.next_step,
        "why": row.why,
        "updated_at": row.updated_at,
    }


def cmd_list(args: argparse.Namespace) -> int:
    def body() -> int:

        if args.limit < 1:
            raise Refusal("--limit must be at least 1.")
        session = db.session()
        stmt = queries.filtered_workflows(_filters(args))
        page = queries.keyset_page(session, stmt, Workflow.id, after=args.after, limit=args.limit)
        rows = presenters.workflow_rows(session, page.items)
        if args.json:
            _print_json({"workflows": [_row_dict(r) for r in rows], "older": page.older})
            return 0
        for r in rows:
            badges = ",".join(b.label for b in r.badges)
            print(f"#{r.id}\t{r.workflow_class}\t{badges}\t{r.next_step or '-'}\t{r.why}")
        if not rows:
            print("No workflows match.", file=sys.stderr)
        if page.older:
            print(f"More: --after {page.older}", file=sys.stderr)
        return 0

    return _run(args, body)


def cmd_show(args: argparse.Namespace) -> int:
    def body() -> int:

        session = db.session()
        workflow = session.get(Workflow, args.id)
        if workflow is None:
            raise Refusal(f"Workflow #{args.id} does not exist.")
        detail = presenters.workflow_detail(session, workflow, None)
        if args.json:
            data = dataclasses.asdict(detail)
            data.pop("actions", None)
            _print_json(data)
            return 0
        row = detail.row
        print(f"{row.workflow_class} #{row.id}  {', '.join(b.label for b in row.badges)}")
        print(f"  why:   {row.why}")
        print(f"  hero:  {row.hero_type or '-'} {row.hero_id or ''}".rstrip())
        print(f"  next:  {row.next_step or '-'}")
        print("  plan:  " + "  ".join(f"{s.name} [{s.status}]" for s in detail.plan))
        print("  timeline:")
        for entry in detail.timeline:
            print(f"    {entry.at:%Y-%m-%d %H:%M:%S} {_timeline_text(entry)}")
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


# --- actions -------------------------------------------------------------------------------------


def _selection(args: argparse.Namespace) -> list[int]:
    """The ids to act on: the ones named (each must exist), or the filter's (within the cap)."""

    filters = _filters(args)
    if args.ids and not filters.is_empty:
        raise Refusal("Give workflow ids or filters, not both.")
    if args.ids:
        ids = sorted(set(args.ids), reverse=True)
        found = set(db.session.scalars(select(Workflow.id).where(Workflow.id.in_(ids))))
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
    cap = int(current_app.config["BULK_CAP"])
    ids = queries.capped_ids(db.session(), filters, cap)
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
        return {"name": args.name, "payload": payload, "idempotency_key": args.idempotency_key}
    return {}


def _label(action: str, args: argparse.Namespace) -> str:
    if action == "resume_at":
        return f"Resume at {args.target_step}"
    if action == "signal":
        return f"Signal {args.name}"
    return ACTIONS[action]


def _action_command(action: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        return _run(args, lambda: _act(action, args))

    command.__name__ = f"cmd_{action}"
    return command


def _act(action: str, args: argparse.Namespace) -> int:

    ids = _selection(args)
    params = _params(action, args)
    label = _label(action, args)
    if args.dry_run or not ids:
        noun = "workflow" if len(ids) == 1 else "workflows"
        preview = f"{label}: {len(ids)} {noun} would be changed (dry run; nothing changed)."
        if args.json:
            _print_json({"action": action, "dry_run": True, "count": len(ids), "ids": ids})
        else:
            print(preview)
            if ids:
                print(" ".join(f"#{i}" for i in ids))
        return 0
    who = actor()
    if len(ids) == 1:
        result = operator_actions.perform(who, ids[0], action, params)
        outcome: dict[str, Any] = {
            "action": action,
            "count": 1,
            "done": int(result.ok),
            "refused": int(not result.ok),
            "messages": [f"#{ids[0]}: {result.message}"],
            "batch": None,
        }
    else:
        selection: dict[str, Any] = {"via": "cli"}
        if args.ids:
            selection["ids"] = ids[:100]
        selection["filters"] = _filters(args).as_params()
        bulk = operator_actions.perform_bulk(who, ids, action, params, selection)
        outcome = {
            "action": action,
            "count": len(ids),
            "done": bulk.done,
            "refused": bulk.refused,
            "messages": bulk.messages,
            "batch": bulk.audit_id,
        }
    outcome["ok"] = outcome["refused"] == 0
    if args.json:
        _print_json(outcome)
    else:
        refused = f", {outcome['refused']} refused" if outcome["refused"] else ""
        summary = f"{label}: {outcome['done']} done{refused}."
        if outcome["ok"]:
            for line in outcome["messages"]:
                print(line)
            print(summary)
        else:
            for line in outcome["messages"]:
                print(line, file=sys.stderr)
            print(summary, file=sys.stderr)
    return 0 if outcome["ok"] else REFUSED
