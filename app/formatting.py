"""Jinja filters for times and durations: relative in text, absolute UTC for ``<time>``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from markupsafe import Markup, escape

from geneva_drive.models import utcnow


def _span(seconds: float) -> str:
    seconds = abs(int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400 * 2:
        hours, rest = divmod(seconds, 3600)
        minutes = rest // 60
        return f"{hours} h {minutes} min" if minutes and hours < 10 else f"{hours} h"
    return f"{seconds // 86400} days"


def relative(value: datetime | None, now: datetime | None = None) -> str:
    """``3 min ago`` / ``in 2 h`` (``now`` within a second)."""
    if value is None:
        return "—"
    delta = (value - (now or utcnow())).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago"


def utc(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(value: float | timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds == int(seconds) else f"{seconds:.1f} s"
    return _span(seconds)


def code_text(value: Any) -> Markup:
    """Engine text to HTML: the step and error names it marks with backticks become
    ``<code>``, everything else is escaped text (never rendered as Markdown or HTML)."""
    if value is None:
        return Markup("")
    parts = str(value).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: not markup, show it as it is
        return Markup(escape(str(value)))
    return Markup("").join(
        Markup("<code>{}</code>").format(part) if i % 2 else escape(part)
        for i, part in enumerate(parts)
        if part
    )


def code_text_links(value: Any, links: list[tuple[str, dict[str, str]]]) -> Markup:
    """:func:`code_text`, with each phrase of ``links`` (the first time it appears) a link to
    the workflows list filtered by its query parameters."""
    from geneva_drive.dashboard.urls import url_for

    text = "" if value is None else str(value)
    out = Markup("")
    for phrase, params in links:
        before, found, text = text.partition(phrase)
        if not found:
            text = before
            continue
        href = url_for("workflows.index", **params)
        out += code_text(before) + Markup('<a href="{}">{}</a>').format(href, code_text(phrase))
    return out + code_text(text)


def number(value: Any) -> str:
    return f"{int(value):,}"


#: The dashboard's Jinja filters (installed on its own environment, app.rendering).
FILTERS: dict[str, Any] = {
    "relative": relative,
    "utc": utc,
    "iso": iso,
    "duration": duration,
    "number": number,
    "code_text": code_text,
    "code_text_links": code_text_links,
}
