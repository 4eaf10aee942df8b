"""A warm shutdown was asked for (the first Ctrl-C / SIGTERM of a worker).

One process-wide flag, below everything that asks it: running resumable steps stop at their
next checkpoint, and a chain of inline successors stops at the next step boundary
(engine/inline.py), handing the successor to the broker.
"""

from __future__ import annotations

import threading

_shutdown = threading.Event()


def request_shutdown() -> None:
    """Ask running resumable steps to stop at their next checkpoint (warm shutdown)."""
    _shutdown.set()


def clear_shutdown() -> None:
    _shutdown.clear()


def shutdown_requested() -> bool:
    return _shutdown.is_set()


__all__ = ["clear_shutdown", "request_shutdown", "shutdown_requested"]
