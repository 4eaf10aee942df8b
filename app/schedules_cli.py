"""``geneva-drive schedules``: the dashboard's Schedules page and its actions on the command line.

::

    geneva-drive schedules [list] [--json]
    geneva-drive schedules pause|resume NAME [--actor NAME] [--json]
    geneva-drive schedules run-now NAME [--actor NAME] [--json]

``list`` prints what /schedules shows (:func:`geneva_drive.dashboard.schedules.schedules_view`);
the actions are :func:`geneva_drive.operator_actions.perform_schedule`, with the dashboard's
refusals and audit rows (actor ``cli:<OS user>``, as for ``geneva-drive workflows …``). A
refusal or an unknown schedule exits 1 with the message on stderr. Every text read from the
database goes through :func:`geneva_drive.logsafe.escape`: a schedule name or a skip reason
holding a newline or an ANSI escape must not forge rows or move the terminal's cursor.

No Flask, like the other operator commands (app/operator_cli.py, whose runtime it uses).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sqlalchemy.orm import Session

from geneva_drive import liveness, operator_actions, transport
from geneva_drive.dashboard import operator_cli
from geneva_drive.dashboard import schedules as schedule_list
from geneva_drive.dashboard.operator_cli import REFUSED, Runtime
from geneva_drive.explain import humanize
from geneva_drive.logsafe import escape
from geneva_drive.models import utcnow

#: The action subcommands and the engine's action (its audit name).
ACTIONS = {
    "pause": "schedule_pause",
    "resume": "schedule_resume",
    "run-now": "schedule_run_now",
}
COLUMNS = ("NAME", "STATE", "WHEN", "NEXT FIRE", "LAST RUN", "SKIPPED", "MISSED", "SOURCE")


def add_schedules_parser(subparsers: Any) -> None:
    """``geneva-drive schedules [list|pause|resume|run-now NAME]``."""
    parser = subparsers.add_parser(
        "schedules", help="recurring schedules: list them, pause, resume or run one now"
    )
    operator_cli._json_argument(parser)
    operator_cli._set(parser, cmd_list)
    commands = parser.add_subparsers(dest="schedules_command")
    listing = commands.add_parser(
        "list", help="every schedule: cadence, next fire time, last run, skipped and missed ticks"
    )
    operator_cli._json_argument(listing)
    operator_cli._set(listing, cmd_list)
    for name, action in ACTIONS.items():
        command = commands.add_parser(name, help=_HELP[name])
        command.add_argument("name", metavar="NAME", help="the schedule's name")
        command.add_argument(
            "--actor",
            default=None,
            metavar="NAME",
            help='who is acting, recorded beside the OS user ("cli:<user> as NAME")',
        )
        operator_cli._json_argument(command)
        operator_cli._set(command, _action_command(action))


_HELP = {
    "pause": "stop a schedule firing (its ticks meanwhile are missed)",
    "resume": "fire a paused schedule again (missed ticks follow its catch_up)",
    "run-now": "create one workflow of a schedule now; its next tick stays",
}


def _cells(row: schedule_list.ScheduleRowView, now: Any) -> list[str]:
    state = row.state + (f", late by {humanize(row.late_by)}" if row.late_by else "")
    when = f"{escape(row.description)} ({escape(row.timezone)})"
    nxt = escape(row.next_times[0].local) if row.next_times else "-"
    if row.last_run is None:
        last = "-"
    else:
        run = row.last_run
        last = f"{escape(run.workflow_class)} #{run.workflow_id} {run.state or 'deleted'}"
    skipped = str(row.ticks_skipped)
    if row.ticks_skipped and row.last_skip_reason:
        skipped += f" ({escape(row.last_skip_reason)})"
    return [
        escape(row.name),
        state,
        when,
        nxt,
        last,
        skipped,
        str(row.ticks_missed),
        escape(row.source),
    ]


def cmd_list(args: argparse.Namespace) -> int:
    def body(runtime: Runtime, session: Session) -> int:
        view = schedule_list.schedules_view(session, utcnow())
        if args.json:
            operator_cli._print_json(
                {
                    "schedules": [schedule_list.as_dict(r, view.taken_at) for r in view.rows],
                    "counts": {s: view.count(s) for s in ("active", "paused", "disabled")},
                    "truncated": view.truncated,
                }
            )
            return 0
        if not view.rows:
            operator_cli._note(
                "No schedules yet: a workflow class with a schedule adds one when a dispatcher "
                "starts; Schedule.create(...) adds one at run time."
            )
            return 0
        table = [list(COLUMNS)] + [_cells(r, view.taken_at) for r in view.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
        for line in table:
            print(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(line, widths, strict=True)
                ).rstrip()
            )
        counts = " · ".join(f"{view.count(s)} {s}" for s in ("active", "paused", "disabled"))
        operator_cli._note(f"\n{counts}")
        if view.late:
            operator_cli._note(
                f"{len(view.late)} schedule(s) late: a tick is due and no sweep fired it. Check "
                "that a dispatcher runs with the schedule's workflow module loaded."
            )
        if view.truncated:
            operator_cli._note(f"Only the {schedule_list.LIMIT} soonest to fire are listed.")
        return 0

    return operator_cli._run(args, body)


def _action_command(action: str) -> Any:
    verb = next(name for name, value in ACTIONS.items() if value == action)

    def command(args: argparse.Namespace) -> int:
        if action == "schedule_run_now":
            # Run now creates a workflow whose first step goes to the broker: never to one this
            # process was not given (docs/MANUAL.md, "The command line in a host app").
            transport.require_publisher(f"geneva-drive schedules {verb}")

        def act(runtime: Runtime, session: Session) -> int:
            if action == "schedule_run_now":
                liveness.require_fed_queue(f"geneva-drive schedules {verb}", session)
            who = operator_cli.actor(args.actor)
            result = operator_actions.perform_schedule(session, who, args.name, action)
            if args.json:
                operator_cli._print_json(
                    {
                        "action": action,
                        "schedule": args.name,
                        "ok": result.ok,
                        "message": result.message,
                        "workflow_id": result.workflow_id,
                    }
                )
            if result.ok:
                if not args.json:
                    print(escape(result.message))
                return 0
            sys.stdout.flush()
            print(f"geneva-drive: {escape(result.message)}", file=sys.stderr)
            return REFUSED

        return operator_cli._run(args, act)

    command.__name__ = f"cmd_{action}"
    return command
