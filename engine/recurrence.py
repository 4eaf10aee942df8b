"""When a recurring workflow fires: the ``Schedule`` definition and its tick arithmetic.

A :class:`Schedule` is a value: a five-field cron expression (or ``@hourly``, ``@daily``,
``@weekly``, ``@monthly``) *or* a fixed interval (``every=``), read in an IANA time zone, with
what to do about missed ticks (``catch_up``) and about a tick that comes while the previous
run still goes on (``overlap``). As a class attribute of a workflow it is a schedule defined in
code; :meth:`Schedule.create` adds one at run time (a row of ``geneva_drive_schedules``). The
firing itself - exactly once per tick, under the schedule row's lock - is
engine/schedules.py's; docs/MANUAL.md, "Recurring work", is the user's guide.

Cron fields are read in the schedule's time zone, with the rules of classic cron for the two
daylight-saving changes: a local time that does not exist (02:30 on a spring-forward night in
Europe/Berlin) fires once, at the end of the gap (03:00 local); a local time that occurs twice
(fall back) fires once, at the first. The cron parser is ``cronsim`` (small, pure Python,
maintained, and with exactly these DST rules); ``croniter`` was weighed and left: its DST
handling differs between versions and it was declared end-of-life once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import registry
from geneva_drive.errors import ScheduleError
from geneva_drive.models import ScheduleRow, utcnow
from geneva_drive.workflow import hero_key

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow

CATCH_UP_POLICIES = ("skip", "latest", "all")
OVERLAP_POLICIES = ("skip", "allow", "cancel_previous")
#: Names for the cron shorthands cronsim does not read itself.
_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
}
#: A schedule's name: what the dashboard, the CLI and the metrics label show.
_NAME = re.compile(r"[A-Za-z0-9_.:/@-]{1,255}")
#: The shortest interval accepted: a tick is a transaction and a workflow; shorter is a loop.
MIN_EVERY = timedelta(seconds=1)
#: The most ticks one sweep walks for one schedule (catch_up="all" over a long window).
MAX_TICKS_PER_SWEEP = 1000


@dataclass
class Schedule:
    """A recurring workflow: see the module docstring and docs/MANUAL.md, "Recurring work".

    ``hero`` is an object (a mapped row) or a callable taking the session, called at each
    tick; None for a class that proceeds without one.
    """

    cron: str | None = None
    every: timedelta | float | None = None
    timezone: str = "UTC"
    hero: Any = None
    catch_up: str = "latest"
    catch_up_window: timedelta | float = timedelta(days=1)
    overlap: str = "skip"
    name: str | None = None
    #: Set when the class is defined (a code schedule) or by create (a runtime one).
    workflow: type[Workflow] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.every is not None and not isinstance(self.every, timedelta):
            if isinstance(self.every, bool) or not isinstance(self.every, int | float):
                raise ScheduleError(f"every= is a timedelta or seconds, got {self.every!r}")
            self.every = timedelta(seconds=self.every)
        if not isinstance(self.catch_up_window, timedelta):
            window = self.catch_up_window
            if isinstance(window, bool) or not isinstance(window, int | float):
                raise ScheduleError(f"catch_up_window= is a timedelta or seconds, got {window!r}")
            self.catch_up_window = timedelta(seconds=window)

    # --- validation ------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise :class:`ScheduleError` naming what is wrong (the class check turns it into a
        ``StepConfigurationError``)."""
        if (self.cron is None) == (self.every is None):
            raise ScheduleError(
                "give exactly one of cron= (a cron expression) or every= (a timedelta)"
            )
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise ScheduleError(f"cron= is a string such as '0 3 * * *', got {self.cron!r}")
            try:
                CronSim(self.cron_expression, datetime(2026, 1, 1, tzinfo=UTC))
            except CronSimError as error:
                raise ScheduleError(
                    f"cron={self.cron!r} is not a five-field cron expression ({error}); e.g. "
                    "'0 3 * * *' (03:00 daily) or @hourly, @daily, @weekly, @monthly"
                ) from None
        else:
            assert isinstance(self.every, timedelta)
            if self.every < MIN_EVERY:
                raise ScheduleError(f"every= must be at least {MIN_EVERY.total_seconds():g} s")
        self.zone()  # raises for an unknown zone
        if self.catch_up not in CATCH_UP_POLICIES:
            raise ScheduleError(
                f"catch_up={self.catch_up!r}: use one of {', '.join(CATCH_UP_POLICIES)}"
            )
        if self.overlap not in OVERLAP_POLICIES:
            raise ScheduleError(
                f"overlap={self.overlap!r}: use one of {', '.join(OVERLAP_POLICIES)}"
            )
        assert isinstance(self.catch_up_window, timedelta)
        if self.catch_up_window < timedelta(0):
            raise ScheduleError("catch_up_window= must not be negative")
        if self.name is not None and not (
            isinstance(self.name, str) and _NAME.fullmatch(self.name)
        ):
            raise ScheduleError(
                f"name={self.name!r}: 1-255 characters of letters, digits and _ . : / @ -"
            )

    @property
    def cron_expression(self) -> str:
        assert self.cron is not None
        text = self.cron.strip()
        return _ALIASES.get(text.lower(), text)

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ScheduleError(
                f"timezone={self.timezone!r} is not an IANA time zone (e.g. 'Europe/Berlin', "
                "'America/New_York', 'UTC')"
            ) from None

    # --- ticks -----------------------------------------------------------------------------

    def ticks_after(self, after: datetime, anchor: datetime | None = None) -> Iterator[datetime]:
        """The fire times strictly after ``after`` (UTC, aware), in order, without end.

        ``every=`` ticks fall at ``anchor + k·every`` (the anchor is the schedule's first
        tick); with no anchor the first tick is ``after + every``.
        """
        if self.cron is not None:
            local = after.astimezone(self.zone())
            for tick in CronSim(self.cron_expression, local):
                yield tick.astimezone(UTC)
            return
        assert isinstance(self.every, timedelta)
        step = self.every
        if anchor is None:
            tick = after + step
        else:
            passed = max(0, int((after - anchor) / step) + 1) if after >= anchor else 0
            tick = anchor + passed * step
            while tick <= after:
                tick += step
        while True:
            yield tick
            tick += step

    def next_fire_times(self, n: int, after: datetime | None = None) -> list[datetime]:
        """The next ``n`` fire times after ``after`` (default now), UTC and aware."""
        self.validate()
        ticks = self.ticks_after(after or utcnow())
        return [next(ticks) for _ in range(n)]

    def describe(self) -> str:
        """The cadence in words: "At 03:00" / "every 15 min"."""
        if self.cron is not None:
            try:
                text: str = CronSim(
                    self.cron_expression, datetime(2026, 1, 1, tzinfo=UTC)
                ).explain()
            except Exception:  # explain() does not cover every expression cronsim accepts
                text = f"cron {self.cron}"
            return text
        assert isinstance(self.every, timedelta)
        seconds = self.every.total_seconds()
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if seconds >= size and seconds % size == 0:
                return f"every {seconds / size:g} {unit}"
        return f"every {seconds:g} s"

    # --- runtime schedules -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        session: Session,
        name: str,
        workflow: type[Workflow],
        hero: Any = None,
        **options: Any,
    ) -> ScheduleRow:
        """Add a runtime schedule (a row), flushed in ``session``'s transaction; ``ValueError``
        for an invalid definition or a name already taken. Options as for ``Schedule(...)``."""
        if callable(hero) and not hasattr(hero, "__table__"):
            raise ScheduleError(
                "a runtime schedule's hero is a row (stored by its id), not a callable"
            )
        schedule = cls(name=name, **options)
        schedule.workflow = workflow
        schedule.validate()
        if not registry.is_registered(workflow):
            raise ScheduleError(f"{workflow!r} is not a registered Workflow subclass")
        taken = session.scalar(select(ScheduleRow.id).where(ScheduleRow.name == name))
        if taken is not None:
            raise ScheduleError(f"a schedule named {name!r} exists already; pick another name")
        hero_type, hero_id = hero_key(hero) if hero is not None else (None, None)
        now = utcnow()
        row = schedule.new_row(workflow.workflow_name, source="runtime", now=now)
        row.hero_type, row.hero_id = hero_type, hero_id
        session.add(row)
        session.flush()
        return row

    def new_row(self, workflow_type: str, *, source: str, now: datetime) -> ScheduleRow:
        """A row for this definition, its first tick the first after ``now``."""
        row = ScheduleRow(
            name=self.name,
            workflow_type=workflow_type,
            source=source,
            paused=False,
            created_at=now,
            updated_at=now,
        )
        self.write_to(row, now)
        return row

    def write_to(self, row: ScheduleRow, now: datetime) -> None:
        """Write this definition's timing and policies onto ``row``; a changed cadence starts
        again from ``now``."""
        every = None if self.every is None else self.every.total_seconds()  # type: ignore[union-attr]
        timing = (self.cron, every, self.timezone)
        changed = (row.cron, row.every_seconds, row.timezone) != timing or row.next_fire_at is None
        row.cron, row.every_seconds, row.timezone = timing
        row.catch_up = self.catch_up
        row.catch_up_window_seconds = self.catch_up_window.total_seconds()  # type: ignore[union-attr]
        row.overlap = self.overlap
        if changed:
            first = next(self.ticks_after(now))
            row.anchor_at = first
            row.next_fire_at = first

    @staticmethod
    def from_row(row: ScheduleRow) -> Schedule:
        """The definition a row holds."""
        return Schedule(
            cron=row.cron,
            every=None if row.every_seconds is None else timedelta(seconds=row.every_seconds),
            timezone=row.timezone,
            catch_up=row.catch_up,
            catch_up_window=timedelta(seconds=row.catch_up_window_seconds),
            overlap=row.overlap,
            name=row.name,
        )
