"""The WSGI server of ``geneva-drive up``: waitress, with request and header deadlines.

Why waitress (README "Security"): it is pure Python (no compiler, runs wherever the embedded
default runs, Windows included), kept by the Pylons project, and it reads every request in full
on its event loop before a worker thread sees it. So a client that sends its headers slowly
holds a socket, never one of the few threads that run the dashboard: 400 slow-header sockets do
not stall the operator's page. (cheroot, the other candidate, gives each connection a thread
while it reads the request; gunicorn does not run on Windows and forks, which the embedded
worker and its threads in the same process do not survive.)

On top of waitress's own idle timeout (``channel_timeout``) this module adds two deadlines
waitress does not have, checked every second on its event loop: the request line and headers
must arrive within ``header_timeout`` seconds of the request's first byte, the whole request
(body included) within ``request_timeout``; a connection past either is closed. A slow-drip
client (one byte every few seconds keeps waitress's idle timer fresh) is cut off all the same.
The ``Server`` header says ``GenevaDrive``, without a version.

API for the CLI: ``server = make_server(app, host, port)``; ``server.server_port``;
``server.serve_forever()`` (blocks; run it in a thread) and ``server.shutdown()`` from another.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer

#: Seconds from a request's first byte until its headers must be complete.
HEADER_TIMEOUT = 10.0
#: Seconds from a request's first byte until it must be complete, body included (bodies are at
#: most MAX_CONTENT_LENGTH, 1 MiB: this is generous for any real client).
REQUEST_TIMEOUT = 30.0
#: Seconds an idle keep-alive connection stays open.
IDLE_TIMEOUT = 30.0
#: What the ``Server`` header says: the product, never a version (nothing to match exploits on).
IDENT = "GenevaDrive"
#: Threads running requests (the reading happens on the event loop, not in these).
THREADS = 6
#: Open connections at most (more wait in the listen backlog).
CONNECTION_LIMIT = 200
#: Largest request head accepted (431/400 above it).
MAX_HEADER_BYTES = 64 * 1024


class _Parser(HTTPRequestParser):  # type: ignore[misc]
    """Waitress's request parser, stamped with when the request began."""

    def __init__(self, adj: Adjustments) -> None:
        super().__init__(adj)
        self.started = time.monotonic()


class _Channel(HTTPChannel):  # type: ignore[misc]
    parser_class = _Parser


class DashboardServer(TcpWSGIServer):  # type: ignore[misc]
    """A waitress TCP server that closes connections whose request is too slow to arrive."""

    channel_class = _Channel

    def __init__(
        self,
        app: Any,
        *,
        header_timeout: float,
        request_timeout: float,
        adj: Adjustments,
    ) -> None:
        self.header_timeout = header_timeout
        self.request_timeout = request_timeout
        self._stopped = threading.Event()
        self._running = threading.Event()
        super().__init__(app, map={}, adj=adj)

    @property
    def server_port(self) -> int:
        return int(self.effective_port)

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # waitress: idle channels (channel_timeout)
        mono = time.monotonic()
        for channel in list(self.active_channels.values()):
            partial = getattr(channel, "request", None)
            if partial is None or not isinstance(partial, _Parser):
                continue
            limit = self.request_timeout if partial.headers_finished else self.header_timeout
            if mono - partial.started > limit:
                channel.will_close = True  # waitress closes it on the next loop turn

    def serve_forever(self) -> None:
        self._running.set()
        try:
            self.run()
        finally:
            self._stopped.set()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, stop the threads (from another thread)."""
        if self._running.is_set() and not self._stopped.is_set():
            # Closing sockets belongs to the event loop's thread: hand it over via the trigger.
            self.trigger.pull_trigger(lambda: _close_all(self._map))
            self._stopped.wait(timeout)
        else:
            _close_all(self._map)
        self.task_dispatcher.shutdown(cancel_pending=True, timeout=timeout)


def _close_all(socket_map: dict[Any, Any]) -> None:
    for dispatcher in list(socket_map.values()):
        try:
            dispatcher.close()
        except OSError:
            pass
    socket_map.clear()


def make_server(
    app: Any,
    host: str,
    port: int,
    *,
    header_timeout: float = HEADER_TIMEOUT,
    request_timeout: float = REQUEST_TIMEOUT,
    idle_timeout: float = IDLE_TIMEOUT,
    threads: int = THREADS,
) -> DashboardServer:
    """A server for ``app`` bound to ``host``:``port`` (0 picks a free port), not yet serving."""
    adj = Adjustments(
        host=host,
        port=port,
        ident=IDENT,
        threads=threads,
        channel_timeout=idle_timeout,
        cleanup_interval=1,
        connection_limit=CONNECTION_LIMIT,
        max_request_header_size=MAX_HEADER_BYTES,
        # Flask's MAX_CONTENT_LENGTH answers 413 itself; this is the transport's backstop.
        max_request_body_size=16 * 1024 * 1024,
        # No proxy is trusted, and proxy headers reach the app untouched: the demo's loopback
        # access refuses any request that carries one (a proxy on the same machine would
        # otherwise hand it to outside clients).
        clear_untrusted_proxy_headers=False,
        expose_tracebacks=False,
        log_socket_errors=False,
    )
    return DashboardServer(
        app, header_timeout=header_timeout, request_timeout=request_timeout, adj=adj
    )
