"""``geneva-drive``: run GenevaDrive from one command.

``geneva-drive up [--demo] [--host 127.0.0.1] [--port 8000]`` is the embedded default (SPEC
§3): it migrates the database (a SQLite file under ``./var/`` unless ``GENEVA_DATABASE_URL``
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

This module is the composition root: it wires the engine, the dashboard and the demo's example
workflows together, so it lives beside the dashboard (the engine package never imports Flask or
the dashboard; ``scripts/test`` checks that with import-linter).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from flask import Flask

from geneva_drive import db, housekeeping, migrations, transport
from geneva_drive.bootstrap import import_workflow_modules, workflow_module_names
from geneva_drive.dashboard import operator_cli
from geneva_drive.dashboard import server as dashboard_server
from geneva_drive.dispatch import run_dispatcher
from geneva_drive.embedded import DEFAULT_POLL_INTERVAL, EmbeddedWorker
from geneva_drive.errors import ConfigurationError

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
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (ConfigurationError, ImportError) as error:
        # A misconfiguration stops the command at start, with the setting named.
        print(f"geneva-drive {args.command}: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geneva-drive", description="Run GenevaDrive durable workflows."
    )
    parser.add_argument("--log-level", default=os.environ.get("GENEVA_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser(
        "up", help="dashboard + embedded worker + housekeeping on the embedded default"
    )
    up.add_argument("--demo", action="store_true", help="load and seed the example workflows")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    _worker_options(up)
    up.set_defaults(handler=cmd_up)

    worker = commands.add_parser("worker", help="an embedded worker (no broker) + housekeeping")
    _worker_options(worker)
    worker.add_argument("--no-housekeeping", action="store_true")
    worker.set_defaults(handler=cmd_worker)

    dispatcher = commands.add_parser(
        "dispatcher", help="send due executions to Celery and run housekeeping (a loop)"
    )
    dispatcher.add_argument("--interval", type=float, default=None, help="seconds")
    dispatcher.add_argument("--no-housekeeping", action="store_true")
    dispatcher.set_defaults(handler=cmd_dispatcher)

    housekeeping = commands.add_parser("housekeeping", help="run housekeeping once")
    housekeeping.set_defaults(handler=cmd_housekeeping)

    migrate = commands.add_parser("migrate", help="upgrade the database schema")
    migrate.add_argument("--demo", action="store_true", help="also create the demo tables")
    migrate.set_defaults(handler=cmd_migrate)
    # `workflows …` and `signal` (the dashboard's operator actions), loaded like the dashboard.
    operator_cli.add_parsers(commands)
    return parser


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
    if not os.environ.get("GENEVA_DATABASE_URL"):
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
    if sa_engine.dialect.name == "sqlite":
        # The dashboard's engine serves the embedded worker too: give it the engine's SQLite
        # settings (WAL, busy_timeout) and drop connections opened without them.
        db.install_sqlite_pragmas(sa_engine)
        sa_engine.dispose()
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
    server = dashboard_server.make_server(flask_app, args.host, args.port)
    web = _thread(server.serve_forever, "geneva-web")
    url = f"http://{args.host}:{server.server_port}"
    print(f"GenevaDrive dashboard: {url}  (Ctrl-C to stop)", flush=True)
    log.info("dashboard listening on %s", url)

    threads: list[threading.Thread] = []
    try:
        seed: Any = None
        if args.demo:
            # Imported only for the demo: importing it registers the example workflow classes.
            from geneva_drive.examples import seed
        if seed is not None and not stopper.event.is_set():
            seed.seed(stop=stopper.event)
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
    print(f"GenevaDrive dispatcher running (pid {os.getpid()}).", flush=True)
    run_dispatcher(stopper.event, interval=args.interval, housekeeping=not args.no_housekeeping)
    return 0


def cmd_housekeeping(args: argparse.Namespace) -> int:
    import_workflow_modules()
    db.configure()
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
