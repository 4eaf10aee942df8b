"""A tiny metrics facade: the one call housekeeping (and anything else) uses to report gauges.

The gem reports its gauges through Measurometer, so the engine never knows which metrics
library the host application runs. This is the same seam: ``set_gauge(name, value, tags)``
hands the reading to every registered sink, and nothing happens when none is registered.

Names are the gem's (``geneva_drive.ready``, ``geneva_drive.paused_ratio``,
``geneva_drive.waiting_step_executions``, ``geneva_drive.waiting_overdue``); ``tags`` is
empty for totals and ``{"workflow": <type>}`` per workflow class. A Prometheus exporter (or a
StatsD client, or a test) subscribes with::

    from geneva_drive import metrics_facade

    def to_prometheus(name: str, value: float, tags: Mapping[str, str]) -> None: ...

    metrics_facade.add_sink(to_prometheus)

Sinks are called synchronously in the reporting thread; a sink that raises is logged and
skipped so that metrics can never break housekeeping.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

#: ``sink(name, value, tags)``; ``tags`` is a read-only mapping of label name to value.
GaugeSink = Callable[[str, float, Mapping[str, str]], None]

_lock = threading.Lock()
_sinks: list[GaugeSink] = []


def add_sink(sink: GaugeSink) -> None:
    """Receive every gauge reported from now on (idempotent for the same sink)."""
    with _lock:
        if sink not in _sinks:
            _sinks.append(sink)


def remove_sink(sink: GaugeSink) -> None:
    """Stop sending gauges to ``sink`` (no error if it was never added)."""
    with _lock:
        if sink in _sinks:
            _sinks.remove(sink)


def set_gauge(name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
    """Report the current value of gauge ``name`` (with ``tags``) to every sink."""
    with _lock:
        sinks = list(_sinks)
    frozen = dict(tags or {})
    for sink in sinks:
        try:
            sink(name, value, frozen)
        except Exception:
            log.exception("metrics sink %r failed on gauge %s", sink, name)
