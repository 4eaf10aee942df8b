"""A StatsD sink for :mod:`geneva_drive.metrics_facade`: the gem's gauges over UDP.

::

    from geneva_drive import metrics_facade
    from geneva_drive.statsd import StatsdSink

    metrics_facade.add_sink(StatsdSink("127.0.0.1", 8125))

Tags go out in the DogStatsD form (``geneva_drive.paused_ratio:0.25|g|#workflow:Payment``),
understood by Datadog, Telegraf and statsd_exporter; ``tag_format=None`` folds them into the
name for a plain StatsD server (``geneva_drive.paused_ratio.workflow.Payment:0.25|g``).
UDP is fire-and-forget: a missing agent costs nothing and raises nothing.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping

from geneva_drive.errors import ConfigurationError

log = logging.getLogger(__name__)


class StatsdSink:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 8125, *, tag_format: str | None = "dogstatsd"
    ) -> None:
        if tag_format not in ("dogstatsd", None):
            raise ConfigurationError(f"tag_format must be 'dogstatsd' or None, got {tag_format!r}")
        self.address = (host, port)
        self.tag_format = tag_format
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def __repr__(self) -> str:
        return f"StatsdSink({self.address[0]!r}, {self.address[1]})"

    def __call__(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        try:
            self._socket.sendto(self.line(name, value, tags).encode(), self.address)
        except OSError as error:  # agent not running, buffer full: metrics are best effort
            log.debug("statsd send failed: %s", error)

    def line(self, name: str, value: float, tags: Mapping[str, str]) -> str:
        number = f"{value:g}"
        if self.tag_format is None:
            folded = "".join(f".{_safe(k)}.{_safe(v)}" for k, v in sorted(tags.items()))
            return f"{name}{folded}:{number}|g"
        suffix = ",".join(f"{_safe(k)}:{_safe(v)}" for k, v in sorted(tags.items()))
        return f"{name}:{number}|g" + (f"|#{suffix}" if suffix else "")

    def close(self) -> None:
        self._socket.close()


def _safe(value: str) -> str:
    # StatsD separators (: | # , @) and spaces must not reach the wire inside a name or tag.
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in str(value))
