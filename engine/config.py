"""Run-time settings of the engine, with the gem's defaults.

``engine.settings`` is a single mutable object: assign at run time
(``settings.stuck_recovery_action = "cancel"``) or set the ``GENEVA_*`` environment variable
named beside each field before the process starts. Durations are ``timedelta``; a plain
number of seconds is accepted and converted; ``None`` disables where the gem allows it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from geneva_drive.errors import ConfigurationError, InvalidInputError

_DURATION_FIELDS = {
    "delete_completed_workflows_after",
    "stuck_in_progress_threshold",
    "stuck_scheduled_threshold",
    "waiting_visibility_threshold",
    "dispatch_interval",
    "dispatch_horizon",
    "dispatch_resend_after",
    "housekeeping_interval",
    "overdue_grace",
    "inline_successor_max_time",
    "worker_heartbeat_interval",
    "worker_lease",
}
_NULLABLE_FIELDS = {
    "delete_completed_workflows_after",
    "archive_completed_workflows_to",
    "waiting_visibility_threshold",
    "max_cursor_size",
    "max_signal_payload_size",
}
_INT_FIELDS = {
    "housekeeping_batch_size",
    "max_cursor_size",
    "max_signal_payload_size",
    "inline_successor_max_steps",
    "inline_successor_yield_after",
}
_BOOL_FIELDS = {
    "enqueue_after_commit",
    "synchronous_start_commit",
    "inline_successors",
    "inline_successor_start_with_outcome",
}
STUCK_RECOVERY_ACTIONS = ("reattempt", "cancel")


def to_timedelta(value: Any, name: str = "duration") -> timedelta:
    """Accept a ``timedelta`` or a number of seconds; reject everything else clearly."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(
            f"{name} must be a datetime.timedelta or a number of seconds, got {value!r}"
        )
    return timedelta(seconds=value)


@dataclass
class Settings:
    #: GENEVA_DELETE_COMPLETED_WORKFLOWS_AFTER — housekeeping deletes finished/canceled
    #: workflows whose ``transitioned_at`` is older. None disables deletion.
    delete_completed_workflows_after: timedelta | None = timedelta(days=30)
    #: GENEVA_ARCHIVE_COMPLETED_WORKFLOWS_TO — a directory: housekeeping then writes those
    #: workflows (with their executions and signals) there as gzip JSON Lines, one file per
    #: day, verified, before it deletes them (geneva_drive.archive). None: delete only.
    archive_completed_workflows_to: str | None = None
    #: GENEVA_STUCK_IN_PROGRESS_THRESHOLD — an in_progress execution started longer ago is stuck.
    stuck_in_progress_threshold: timedelta = timedelta(hours=1)
    #: GENEVA_STUCK_SCHEDULED_THRESHOLD — a scheduled execution overdue by longer is stuck.
    stuck_scheduled_threshold: timedelta = timedelta(minutes=15)
    #: GENEVA_HOUSEKEEPING_BATCH_SIZE — workflows per cleanup transaction (with their
    #: executions and signals, at most 5x as many rows in all); executions per recovery batch.
    housekeeping_batch_size: int = 1000
    #: GENEVA_STUCK_RECOVERY_ACTION — "reattempt" or "cancel".
    stuck_recovery_action: str = "reattempt"
    #: GENEVA_MAX_CURSOR_SIZE — bytes of compact cursor JSON; None disables the check.
    max_cursor_size: int | None = 128 * 1024
    #: GENEVA_MAX_SIGNAL_PAYLOAD_SIZE — bytes of compact payload JSON; None disables the check.
    max_signal_payload_size: int | None = 128 * 1024
    #: GENEVA_WAITING_VISIBILITY_THRESHOLD — a parked execution older than this is "overdue".
    waiting_visibility_threshold: timedelta | None = timedelta(days=7)
    #: GENEVA_ENQUEUE_AFTER_COMMIT — send step messages only after the creating transaction
    #: commits (the only safe choice in production); False sends at once.
    enqueue_after_commit: bool = True
    #: GENEVA_SYNCHRONOUS_START_COMMIT — PostgreSQL: also wait for the WAL flush of a step's
    #: start transition (one fsync more per step). False (the default) commits it with
    #: ``synchronous_commit = off``: a database server crash may then revert a just-started
    #: execution to scheduled, and it runs again; every outcome is committed synchronously.
    synchronous_start_commit: bool = False
    #: GENEVA_DISPATCH_INTERVAL — how often the dispatcher looks for due executions.
    dispatch_interval: timedelta = timedelta(seconds=5)
    #: GENEVA_DISPATCH_HORIZON — executions due within this are sent at commit with a countdown;
    #: later ones are left to the dispatcher (no long Celery ETAs, ever).
    dispatch_horizon: timedelta = timedelta(seconds=60)
    #: GENEVA_DISPATCH_RESEND_AFTER — a due execution whose message was sent this long ago and
    #: that still has not started is sent again (messages are at-least-once; running is once).
    dispatch_resend_after: timedelta = timedelta(minutes=2)
    #: GENEVA_HOUSEKEEPING_INTERVAL — how often the dispatcher loop (and the Celery beat
    #: schedule) runs housekeeping: cleanup, stuck recovery and gauges.
    housekeeping_interval: timedelta = timedelta(minutes=5)
    #: GENEVA_OVERDUE_GRACE — a scheduled execution is "overdue" only once it is later than
    #: ``dispatch_interval`` plus this margin: until then a worker may simply not have picked
    #: it up yet, and calling it overdue the moment it is due paints every fresh row red.
    overdue_grace: timedelta = timedelta(seconds=30)
    #: GENEVA_INLINE_SUCCESSORS — a worker that finishes a step whose successor is due now
    #: and routed to a queue it consumes runs that successor itself (its own execution row,
    #: claimed in its own transaction) instead of sending a message for it. False sends every
    #: successor through the broker (or, embedded, through the poller).
    inline_successors: bool = True
    #: GENEVA_INLINE_SUCCESSOR_MAX_STEPS — steps one Celery task (one embedded work item) runs
    #: at most, the delivered one included; the next successor is then sent, so one long
    #: workflow never holds a worker process while other work waits in the queue.
    inline_successor_max_steps: int = 50
    #: GENEVA_INLINE_SUCCESSOR_MAX_TIME — wall time after which a task stops running successors
    #: itself (checked at each step boundary; seconds).
    inline_successor_max_time: timedelta = timedelta(milliseconds=200)
    #: GENEVA_INLINE_SUCCESSOR_YIELD_AFTER — once a task ran this many steps (and every as many
    #: again), it runs the next successor itself only if no other message waits in the queues
    #: it consumes; otherwise the successor is sent to the back of its queue. This keeps a
    #: fresh workflow from waiting behind whole chains (each queued message stays short).
    inline_successor_yield_after: int = 3
    #: GENEVA_INLINE_SUCCESSOR_START_WITH_OUTCOME — an inline successor whose start runs no
    #: code of the application (no cancel or skip condition, no signal or children gate, no
    #: limit; its hero is read again in the same transaction) is started in the commit of its
    #: predecessor's outcome instead of a transaction of its own: one transaction per step
    #: instead of two. The price: a worker
    #: that dies right after that commit leaves the successor in progress (recorded as its), for
    #: the recovery of expired workers (``worker_lease`` plus a sweep), where otherwise it would
    #: leave it due and unsent, for the dispatcher's next sweep.
    inline_successor_start_with_outcome: bool = False
    #: GENEVA_WORKER_HEARTBEAT_INTERVAL — how often a worker process renews its heartbeat
    #: (from a thread of its own, whatever its steps are doing).
    worker_heartbeat_interval: timedelta = timedelta(seconds=5)
    #: GENEVA_WORKER_LEASE — a worker whose last heartbeat is older than this is expired: the
    #: next dispatcher sweep recovers its in-progress executions. Must exceed the heartbeat
    #: interval (twice it at least), so one late beat does not expire a live worker.
    worker_lease: timedelta = timedelta(seconds=30)
    _frozen: bool = field(default=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name not in {f.name for f in fields(self)}:
            raise AttributeError(f"engine.settings has no setting {name!r}")
        object.__setattr__(self, name, _coerce(name, value))

    @property
    def overdue_after(self) -> timedelta:
        """How late a scheduled execution must be to count as overdue (everywhere: the why
        line, the dashboard's badges and filter, the overview and ``/metrics``)."""
        return self.dispatch_interval + self.overdue_grace

    def reset(self) -> None:
        """Restore every setting to its default (tests use this)."""
        for f in fields(self):
            if not f.name.startswith("_"):
                setattr(self, f.name, f.default)

    def load_env(self, environ: dict[str, str] | None = None) -> None:
        """Read ``GENEVA_<SETTING>`` variables; an invalid value names the variable."""
        env = os.environ if environ is None else environ
        for f in fields(self):
            if f.name.startswith("_"):
                continue
            key = f"GENEVA_{f.name.upper()}"
            if key not in env:
                continue
            raw = env[key].strip()
            try:
                setattr(self, f.name, _parse_env(f.name, raw))
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{key}={raw!r} is not valid: {exc}") from exc


def _parse_env(name: str, raw: str) -> Any:
    if name in _NULLABLE_FIELDS and raw.lower() in ("", "none", "null", "off"):
        return None
    if name in _BOOL_FIELDS:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigurationError("expected true or false")
    if name in _DURATION_FIELDS:
        return float(raw)
    if name in _INT_FIELDS:
        return int(raw)
    return raw


def _coerce(name: str, value: Any) -> Any:
    if value is None:
        if name in _NULLABLE_FIELDS:
            return None
        raise ConfigurationError(f"settings.{name} cannot be None")
    if name in _DURATION_FIELDS:
        td = to_timedelta(value, f"settings.{name}")
        if td < timedelta(0):
            raise ConfigurationError(f"settings.{name} must not be negative")
        return td
    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigurationError(f"settings.{name} must be a positive integer, got {value!r}")
        return value
    if name in _BOOL_FIELDS:
        # bool("false") is True: refuse anything but a real bool instead of guessing.
        if not isinstance(value, bool):
            raise ConfigurationError(f"settings.{name} must be True or False, got {value!r}")
        return value
    if name == "stuck_recovery_action":
        value = str(value).rstrip("!")
        if value not in STUCK_RECOVERY_ACTIONS:
            raise ConfigurationError(f"Unknown stuck_recovery_action: {value}")
    return value


settings = Settings()
settings.load_env()


#: The process-level variables: what a process connects to, reads its workflows from and
#: serves, as opposed to ``settings`` (how the engine behaves). The one list of them outside
#: ``Settings``; each is read where it is used, at that moment (a CLI or a test sets it first).
PROCESS_VARIABLES = {
    "GENEVA_DATABASE_URL": "the workflow database (db.database_url)",
    "GENEVA_POOL_PING_AFTER": "seconds a pooled connection may idle before it is tested (db)",
    "GENEVA_BROKER_URL": "the Celery broker (celery_client.broker_url)",
    "GENEVA_DEFAULT_QUEUE": "the queue of steps without a queue job option, and of the sweeps",
    "GENEVA_WORKFLOW_MODULES": "the modules a worker imports its workflows from (bootstrap)",
    "GENEVA_WORKER_METRICS_PORT": "the worker's /metrics port (prometheus)",
    "GENEVA_WORKER_METRICS_ADDR": "the address the worker's /metrics port binds (prometheus)",
    "GENEVA_LOG_LEVEL": "the log level of the geneva-drive command (cli)",
    "GENEVA_BULK_CAP": "the most workflows one CLI bulk action may touch (operator_cli)",
    "GENEVA_METRICS_TOKEN": "the bearer token /metrics requires (dashboard metrics)",
    "GENEVA_ARCHIVE_KEY": "the secret that signs archive files and that restore checks (archive)",
    "GENEVA_CODE_VERSION": "the code version a worker reports on the Workers page (liveness)",
}


def process_variable(name: str) -> str:
    """The value of process-level variable ``name`` (:data:`PROCESS_VARIABLES`), stripped;
    "" when it is unset."""
    if name not in PROCESS_VARIABLES:
        raise KeyError(f"{name} is not a process-level variable; add it to PROCESS_VARIABLES")
    return os.environ.get(name, "").strip()
