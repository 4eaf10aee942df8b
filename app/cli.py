"""``geneva-drive``: run GenevaDrive from one command.

``geneva-drive up [--demo] [--host 127.0.0.1] [--port 8000]`` is the embedded default (docs/MANUAL.md,
"The embedded default"): it migrates the database (a SQLite file under ``./var/`` unless ``GENEVA_DATABASE_URL``
says otherwise), then runs the dashboard, an embedded worker (:mod:`geneva_drive.embedded`; the
step-execution table is the queue, no broker) and the housekeeping loop in one process, and
stops cleanly on Ctrl-C or SIGTERM. ``--demo`` registers the example workflows, seeds a few
hundred of them in every state, and keeps starting new ones.

Other commands, for running the roles separately:

- ``geneva-drive worker`` — an embedded worker (and housekeeping) on the configured database;
  several may share one database. With Celery, run ``celery -A geneva_drive.celery worker`` instead.
- ``geneva-drive dispatcher`` — the dispatcher loop for Celery deployments (sends due
  executions, runs housekeeping); an alternative to ``celery -A geneva_drive.celery beat``.
- ``geneva-drive housekeeping`` — one housekeeping run; prints the report as JSON.
- ``geneva-drive migrate`` — upgrade the database schema and exit.
- ``geneva-drive workflows …`` and ``geneva-drive signal …`` — the operator actions
  (:mod:`geneva_drive.dashboard.operator_cli`); they run without Flask.
- ``geneva-drive workers [--json]`` — the live workers, and those stopped or expired in the
  last day, with the steps each runs (the dashboard's Workers page).
- ``geneva-drive schedules [list|pause|resume|run-now NAME]`` — the recurring schedules and
  their actions (the dashboard's Schedules page; :mod:`geneva_drive.dashboard.schedules_cli`).
- ``geneva-drive check-deploy [--json]`` — run with the new code's workflow modules before a
  deploy: what it would strand (:mod:`geneva_drive.deploy`). Exit 0 clean, 1 problems, 2
  could not check.
- ``geneva-drive doctor [--json]`` — ongoing workflows with no explained next event
  (:mod:`geneva_drive.health`). Same exit codes.
- ``geneva-drive archive --older-than 30d --to DIR`` — finished/canceled workflows to gzip
  JSON Lines, one file per day, verified, then deleted; ``--restore FILE…`` loads them back
  (:mod:`geneva_drive.archive`).

Every subcommand is one :class:`Subcommand` in :data:`SUBCOMMANDS`. Those marked ``in_host``
are also ``flask geneva <name>`` in a host app that uses the extension
(:func:`register_flask_commands`), on the host's database session and Celery app: the same
parser and handler, only the :class:`~geneva_drive.dashboard.operator_cli.Runtime` differs.
To add a command (``archive``…), write ``_add_<name>(subparsers)``
that adds its parser with a ``handler`` taking the parsed arguments and returning the exit
code, and list it in :data:`SUBCOMMANDS`; a handler that needs the database calls
:func:`runtime` first (in a host that is the host's engine, never a second one).

This module is the composition root: it wires the engine, the dashboard and the demo's example
workflows together, so it lives beside the dashboard (the engine package never imports Flask or
the dashboard; ``scripts/test`` checks that with import-linter).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from geneva_drive import archive, db, deploy, health, housekeeping, liveness, migrations, transport
from geneva_drive.bootstrap import import_workflow_modules, workflow_module_names
from geneva_drive.config import process_variable
from geneva_drive.dashboard import operator_cli, schedules_cli
from geneva_drive.dashboard.operator_cli import Runtime
from geneva_drive.dialects import dialect_for
from geneva_drive.dispatch import run_dispatcher
from geneva_drive.embedded import DEFAULT_POLL_INTERVAL, EmbeddedWorker
from geneva_drive.errors import ConfigurationError

if TYPE_CHECKING:
    # Flask is loaded only by the commands that serve the dashboard (`up`): the others, the
    # operator actions among them, run in a process without it.
    from flask import Flask

log = logging.getLogger(__name__)

#: Seconds ``up`` and ``worker`` wait for running steps at shutdown before giving up on them
#: (their executions stay in_progress; housekeeping recovers them later).
SHUTDOWN_GRACE = 20.0
#: Seconds an embedded process waits before its first housekeeping run. After a restart the
#: worker drains the overdue backlog first; housekeeping would otherwise "recover" those rows
#: as stuck-scheduled (harmless, but noise: with the table as the queue nothing was lost).
EMBEDDED_HOUSEKEEPING_DELAY = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (ConfigurationError, ImportError) as error:
        # A misconfiguration stops the command at start, with the setting named.
        print(f"geneva-drive {args.command}: {error}", file=sys.stderr)
        return 2


def _parser(*, host: bool = False, prog: str = "geneva-drive") -> argparse.ArgumentParser:
    """The command's parser: every subcommand, or (``host``) those a host app offers."""
    parser = argparse.ArgumentParser(prog=prog, description="Run GenevaDrive durable workflows.")
    if not host:
        parser.add_argument("--log-level", default=process_variable("GENEVA_LOG_LEVEL") or "INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        if subcommand.in_host or not host:
            subcommand.add(commands)
    return parser


def _add_up(commands: Any) -> None:
    up = commands.add_parser(
        "up", help="dashboard + embedded worker + housekeeping on the embedded default"
    )
    up.add_argument("--demo", action="store_true", help="load and seed the example workflows")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    _worker_options(up)
    up.set_defaults(handler=cmd_up)


def _add_worker(commands: Any) -> None:
    worker = commands.add_parser("worker", help="an embedded worker (no broker) + housekeeping")
    _worker_options(worker)
    worker.add_argument("--no-housekeeping", action="store_true")
    worker.set_defaults(handler=cmd_worker)


def _add_dispatcher(commands: Any) -> None:
    dispatcher = commands.add_parser(
        "dispatcher", help="send due executions to Celery and run housekeeping (a loop)"
    )
    dispatcher.add_argument("--interval", type=float, default=None, help="seconds")
    dispatcher.add_argument("--no-housekeeping", action="store_true")
    dispatcher.set_defaults(handler=cmd_dispatcher)


def _add_housekeeping(commands: Any) -> None:
    housekeeping = commands.add_parser("housekeeping", help="run housekeeping once")
    housekeeping.set_defaults(handler=cmd_housekeeping)


def _add_check_deploy(commands: Any) -> None:
    check_deploy = commands.add_parser(
        "check-deploy",
        help="before a deploy: can the new code run every ongoing workflow? (exit 0/1/2)",
    )
    check_deploy.add_argument("--json", action="store_true", help="machine-readable output")
    check_deploy.set_defaults(handler=lambda args: _checked(deploy.run, args.json))


def _add_doctor(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor", help="list ongoing workflows with no explained next event (exit 0/1/2)"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(handler=lambda args: _checked(health.run, args.json))


def _checked(run: Callable[..., int], as_json: bool) -> int:
    """``check-deploy`` and ``doctor``: the engine's check on the runtime's database. A
    runtime that cannot start (a workflow module that does not import, a bad setting) is
    exit 2, "could not check", like a database that does not answer."""
    try:
        current = runtime()
    except (ImportError, ConfigurationError) as error:
        print(f"could not check: {error}", file=sys.stderr)
        return 2
    with current.session_scope() as session:
        return run(session, as_json=as_json)


def _add_migrate(commands: Any) -> None:
    migrate = commands.add_parser("migrate", help="upgrade the database schema")
    migrate.add_argument("--demo", action="store_true", help="also create the demo tables")
    migrate.set_defaults(handler=cmd_migrate)


def _add_archive(commands: Any) -> None:
    archive_parser = commands.add_parser(
        "archive",
        help="write old finished/canceled workflows to gzip JSON Lines, verify, delete "
        "(or --restore files)",
    )
    archive_parser.add_argument(
        "--older-than", help="age of transitioned_at: 30d, 12h, 90m, 45s or seconds"
    )
    archive_parser.add_argument("--to", type=Path, help="directory of the day files")
    archive_parser.add_argument(
        "--restore", nargs="+", type=Path, metavar="FILE", help="load archive files back"
    )
    archive_parser.add_argument(
        "--batch", type=int, default=500, help="workflows per transaction (default 500)"
    )
    archive_parser.add_argument(
        "--trust-unsigned",
        action="store_true",
        help="restore files that carry no signature (written without GENEVA_ARCHIVE_KEY); only "
        "for files you know where they came from",
    )
    archive_parser.set_defaults(handler=cmd_archive)


def cmd_archive(args: argparse.Namespace) -> int:
    """``archive --older-than AGE --to DIR`` or ``archive --restore FILE…``; prints a JSON
    report. Exit 0 done, 1 an archive file failed its check (nothing of it deleted or
    loaded), 2 bad arguments."""
    restoring = bool(args.restore)
    if restoring == bool(args.older_than or args.to) or (
        not restoring and not (args.older_than and args.to)
    ):
        print(
            "geneva-drive archive: give --older-than AGE --to DIR (archive), "
            "or --restore FILE... (load back)",
            file=sys.stderr,
        )
        return 2
    if args.batch <= 0:
        print("geneva-drive archive: --batch must be a positive number", file=sys.stderr)
        return 2
    try:
        age = None if restoring else archive.parse_age(args.older_than)
    except ValueError as error:
        print(f"geneva-drive archive: --older-than {error}", file=sys.stderr)
        return 2
    current = runtime()
    try:
        if restoring:
            restored = archive.restore(
                args.restore,
                batch=args.batch,
                session_scope=current.session_scope,
                trust_unsigned=args.trust_unsigned,
            )
            print(json.dumps(dataclasses.asdict(restored)))
        else:
            assert age is not None
            written = archive.archive(
                age, args.to, batch=args.batch, session_scope=current.session_scope
            )
            result = dataclasses.asdict(written)
            result["files"] = [str(path) for path in written.files]
            print(json.dumps(result))
    except archive.ArchiveError as error:
        print(f"geneva-drive archive: {error}", file=sys.stderr)
        return 1
    return 0


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of ``geneva-drive``: ``add(subparsers)`` adds its parser, whose
    ``handler`` takes the parsed arguments and returns the exit code. ``in_host``: also
    ``flask geneva <name>`` in a host app (on the host's database and Celery app)."""

    name: str
    add: Callable[[Any], None]
    in_host: bool = False


#: Every subcommand, in help order. The processes that serve or work (``up``, ``worker``,
#: ``dispatcher``) and ``migrate`` (a host runs ``flask db upgrade``) stay out of a host's
#: ``flask geneva``; the operator commands and one-shot maintenance are in it.
SUBCOMMANDS: list[Subcommand] = [
    Subcommand("up", _add_up),
    Subcommand("worker", _add_worker),
    Subcommand("dispatcher", _add_dispatcher),
    Subcommand("housekeeping", _add_housekeeping, in_host=True),
    Subcommand("migrate", _add_migrate),
    # `workflows …` and `signal` (the dashboard's operator actions), without Flask.
    Subcommand("workflows", operator_cli.add_workflows_parser, in_host=True),
    Subcommand("signal", operator_cli.add_signal_parser, in_host=True),
    # The dashboard's Workers page: who runs steps, who died with steps in hand.
    Subcommand("workers", operator_cli.add_workers_parser, in_host=True),
    # The dashboard's Schedules page and its Pause / Resume / Run now.
    Subcommand("schedules", schedules_cli.add_schedules_parser, in_host=True),
    # Read-only checks of the live database (docs/MANUAL.md, "Changing workflows in production").
    Subcommand("check-deploy", _add_check_deploy, in_host=True),
    Subcommand("doctor", _add_doctor, in_host=True),
    # Retention that keeps what it deletes (docs/MANUAL.md, "The dashboard").
    Subcommand("archive", _add_archive, in_host=True),
]


def runtime() -> Runtime:
    """The database and settings of the command being run: the engine's own (from
    ``GENEVA_DATABASE_URL``) under ``geneva-drive``, the host's under ``flask geneva``."""
    return operator_cli.RUNTIME.get()()


def register_flask_commands(app: Flask, host_runtime: Callable[[], Runtime]) -> None:
    """Add ``flask geneva <name> …`` for every ``in_host`` subcommand to a host app's CLI.

    Each forwards its arguments to the same parser and handler as ``geneva-drive <name>``;
    ``host_runtime`` gives the host's database session and settings (the extension's; its
    Celery app is already the engine's by then).
    """
    from flask.cli import AppGroup

    group = AppGroup("geneva", help="GenevaDrive's commands on this app's database and Celery app.")
    for subcommand in SUBCOMMANDS:
        if subcommand.in_host:
            group.add_command(_flask_command(subcommand.name, host_runtime))
    app.cli.add_command(group)


def _flask_command(name: str, host_runtime: Callable[[], Runtime]) -> Any:
    import click

    def forward(arguments: tuple[str, ...]) -> None:
        parser = _parser(host=True, prog="flask geneva")
        args = parser.parse_args([name, *arguments])
        token = operator_cli.RUNTIME.set(host_runtime)
        try:
            code = _dispatch(args)
        finally:
            operator_cli.RUNTIME.reset(token)
        raise SystemExit(code)

    # The arguments go to the parser untouched (its own --help included): one definition of
    # each command's options for `geneva-drive` and `flask geneva`.
    return click.Command(
        name,
        callback=forward,
        params=[click.Argument(["arguments"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"geneva-drive {name} …, on this app (--help for its options).",
    )


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=2, help="worker threads")
    parser.add_argument(
        "--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL, help="seconds"
    )


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        force=True,
    )
    # Alembic's fileConfig disables the loggers that existed before it ran; undo that.
    for logger in logging.root.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = False
    if level.upper() != "DEBUG":
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # One line per plugin on every Alembic command: noise outside debugging.
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _embedded_database_url() -> None:
    """Default ``GENEVA_DATABASE_URL`` to an absolute SQLite path under ``./var/``.

    Absolute, because Flask-SQLAlchemy resolves relative SQLite paths against the app's
    instance folder, and the dashboard and the worker must open the same file.
    """
    if not process_variable("GENEVA_DATABASE_URL"):
        path = Path.cwd() / db.EMBEDDED_DATABASE_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        os.environ["GENEVA_DATABASE_URL"] = f"sqlite:///{path}"


def _load_modules(demo: bool) -> None:
    names = workflow_module_names()
    if demo and "geneva_drive.examples" not in names:
        names.append("geneva_drive.examples")
    import_workflow_modules(names)


# --- the dashboard (Flask, loaded dynamically) -------------------------------------------------


def _is_loopback_host(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _create_dashboard(demo: bool) -> Flask:
    from geneva_drive.dashboard import create_app

    flask_app = create_app({"DEMO": True} if demo else None)
    with flask_app.app_context():
        sa_engine = flask_app.extensions["sqlalchemy"].engine
    # The dashboard's engine serves the embedded worker too: give it the engine's SQLite
    # settings (WAL, busy_timeout) and drop connections opened without them.
    dialect_for(sa_engine).adopt(sa_engine)
    db.configure(engine=sa_engine)
    return flask_app


def _migrate(demo: bool) -> None:
    """Upgrade the engine's schema (its own Alembic history) and, for the demo, its heroes."""
    engine = db.get_engine()
    migrations.upgrade(engine)
    if demo:
        from geneva_drive.examples.models import DEMO_TABLES
        from geneva_drive.models import Base

        # The demo heroes' tables are not part of the engine's migrations (examples/models.py).
        Base.metadata.create_all(engine, tables=DEMO_TABLES)
    log.info("database ready: %s", engine.url.render_as_string(hide_password=True))


class _Stopper:
    """SIGINT/SIGTERM set an event; a second Ctrl-C exits at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.event.is_set():
            log.warning("second %s: exiting without waiting", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s received: shutting down", signal.Signals(signum).name)
        self.event.set()

    def wait(self) -> None:
        while not self.event.wait(0.5):
            pass


def _thread(target: Callable[..., None], name: str, *args: Any, **kwargs: Any) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


# --- commands ----------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    if args.demo and not _is_loopback_host(args.host):
        # The demo hands out operator rights without a login: only this machine may reach it.
        print(
            f"geneva-drive up: --demo serves only loopback (127.0.0.1, ::1, localhost), not "
            f"--host {args.host}. Drop --demo and configure GENEVA_USERS and GENEVA_SECRET_KEY "
            "to serve the network.",
            file=sys.stderr,
        )
        return 2
    stopper = _Stopper()
    _embedded_database_url()
    _load_modules(args.demo)
    flask_app = _create_dashboard(args.demo)  # refuses a missing secret key (main() exits 2)
    _migrate(args.demo)

    worker = EmbeddedWorker(concurrency=args.concurrency, poll_interval=args.poll_interval)
    transport.set_transport(worker.transport)

    # A production server (waitress, with header and request deadlines; see app/server.py),
    # not Werkzeug's development server.
    from geneva_drive.dashboard import server as dashboard_server

    server = dashboard_server.make_server(flask_app, args.host, args.port)
    web = _thread(server.serve_forever, "geneva-web")
    url = f"http://{args.host}:{server.server_port}"
    print(f"GenevaDrive dashboard: {url}  (Ctrl-C to stop)", flush=True)
    if args.demo:
        from geneva_drive.dashboard.auth import DEMO_BANNER

        print(DEMO_BANNER, flush=True)
    log.info("dashboard listening on %s", url)

    threads: list[threading.Thread] = []
    try:
        seed: Any = None
        if args.demo:
            # Imported only for the demo: importing it registers the example workflow classes.
            from geneva_drive.examples import seed
        if seed is not None and not stopper.event.is_set():
            seed.seed(stop=stopper.event)
            # Schedules that fire while you watch /schedules (every 30 s, every minute, ...).
            from geneva_drive.examples import recurring

            recurring.install()
        if not stopper.event.is_set():
            worker.start()
            threads.append(
                _thread(
                    run_dispatcher,
                    "geneva-housekeeping",
                    stopper.event,
                    dispatch=False,
                    first_housekeeping_after=EMBEDDED_HOUSEKEEPING_DELAY,
                )
            )
            if seed is not None:
                threads.append(_thread(seed.run_ticker, "geneva-demo-ticker", stopper.event))
            print("GenevaDrive is running: embedded worker, no broker.", flush=True)
            stopper.wait()
    finally:
        stopper.event.set()
        server.shutdown()
        web.join(5)
        clean = worker.stop(SHUTDOWN_GRACE) if worker.started else True
        for thread in threads:
            thread.join(5)
    print("GenevaDrive stopped.", flush=True)
    return 0 if clean else 1


def cmd_worker(args: argparse.Namespace) -> int:
    stopper = _Stopper()
    import_workflow_modules()
    db.configure()
    worker = EmbeddedWorker(concurrency=args.concurrency, poll_interval=args.poll_interval)
    transport.set_transport(worker.transport)
    worker.start()
    housekeeping = None
    if not args.no_housekeeping:
        housekeeping = _thread(
            run_dispatcher,
            "geneva-housekeeping",
            stopper.event,
            dispatch=False,
            first_housekeeping_after=EMBEDDED_HOUSEKEEPING_DELAY,
        )
    print(f"GenevaDrive embedded worker running (pid {os.getpid()}).", flush=True)
    try:
        stopper.wait()
    finally:
        stopper.event.set()
        clean = worker.stop(SHUTDOWN_GRACE)
        if housekeeping is not None:
            housekeeping.join(5)
    return 0 if clean else 1


def cmd_dispatcher(args: argparse.Namespace) -> int:
    stopper = _Stopper()
    import_workflow_modules()
    db.configure()
    transport.require_publisher("geneva-drive dispatcher")  # never a broker it was not given
    liveness.require_fed_queue("geneva-drive dispatcher")  # nor a queue no worker reads
    print(f"GenevaDrive dispatcher running (pid {os.getpid()}).", flush=True)
    run_dispatcher(stopper.event, interval=args.interval, housekeeping=not args.no_housekeeping)
    return 0


def cmd_housekeeping(args: argparse.Namespace) -> int:
    runtime()  # the workflow classes and the database (the host's under `flask geneva`)
    # Recovered executions are published: never to a broker this process was not given.
    transport.require_publisher("geneva-drive housekeeping")
    liveness.require_fed_queue("geneva-drive housekeeping")
    print(json.dumps(housekeeping.run().as_dict()), flush=True)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    _embedded_database_url()
    _load_modules(args.demo)
    db.configure()
    _migrate(args.demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
