"""Times and durations as the pages print them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from geneva_drive.dashboard.formatting import duration, iso, relative, utc

# Does not use the suite's database (pure functions): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass

NOW = datetime(2026, 11, 29, 8, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (timedelta(0), "now"),
        (timedelta(seconds=-42), "42 s ago"),
        (timedelta(minutes=-3), "3 min ago"),
        (timedelta(hours=3, minutes=10), "in 3 h 10 min"),
        (timedelta(hours=30), "in 30 h"),
        (timedelta(days=-9), "9 days ago"),
    ],
)
def test_relative(offset, text):
    assert relative(NOW + offset, now=NOW) == text


def test_absolute_utc_forms():
    assert utc(NOW) == "2026-11-29 08:00:00 UTC"
    assert iso(NOW) == "2026-11-29T08:00:00Z"
    assert relative(None) == "—" and utc(None) == ""


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.012, "12 ms"),
        (20, "20 s"),
        (2.5, "2.5 s"),
        (timedelta(minutes=15), "15 min"),
        (timedelta(days=7), "7 days"),
        (None, "—"),
    ],
)
def test_duration(value, text):
    assert duration(value) == text
