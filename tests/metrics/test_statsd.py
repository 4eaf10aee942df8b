"""The StatsD sink behind the metrics facade: real UDP datagrams to a local socket."""

from __future__ import annotations

import socket

import pytest

from geneva_drive import metrics, metrics_facade
from geneva_drive.statsd import StatsdSink


@pytest.fixture
def receiver():  # type: ignore[no-untyped-def]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def _lines(sock: socket.socket, count: int) -> list[str]:
    return [sock.recv(4096).decode() for _ in range(count)]


def test_gauges_reach_statsd_with_tags(receiver):
    sink = StatsdSink(*receiver.getsockname())
    metrics_facade.add_sink(sink)
    try:
        metrics_facade.set_gauge("geneva_drive.paused_ratio", 0.25, {"workflow": "Pay|ment"})
        metrics_facade.set_gauge("geneva_drive.ready", 12)
    finally:
        metrics_facade.remove_sink(sink)
        sink.close()
    assert _lines(receiver, 2) == [
        "geneva_drive.paused_ratio:0.25|g|#workflow:Pay_ment",
        "geneva_drive.ready:12|g",
    ]


def test_plain_statsd_folds_tags_into_the_name():
    sink = StatsdSink(tag_format=None)
    try:
        line = sink.line("geneva_drive.waiting_overdue", 3, {"workflow": "Payment"})
    finally:
        sink.close()
    assert line == "geneva_drive.waiting_overdue.workflow.Payment:3|g"


def test_a_missing_agent_raises_nothing():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = StatsdSink("127.0.0.1", port)  # nobody listens there any more
    try:
        for _ in range(3):
            sink("geneva_drive.ready", 1, {})
    finally:
        sink.close()


def test_the_gems_gauges_reach_statsd(geneva_session, seeded, receiver):
    sink = StatsdSink(*receiver.getsockname())
    metrics_facade.add_sink(sink)
    try:
        metrics.report_gauges(metrics.collect(geneva_session, now=seeded))
    finally:
        metrics_facade.remove_sink(sink)
        sink.close()
    receiver.settimeout(0.5)
    lines = []
    try:
        while True:
            lines.append(receiver.recv(4096).decode())
    except TimeoutError:
        pass
    assert "geneva_drive.paused_ratio:1|g|#workflow:MetricsGamma" in lines
    assert "geneva_drive.waiting_overdue:1|g|#workflow:MetricsBeta" in lines
    assert "geneva_drive.ready:5|g" in lines
