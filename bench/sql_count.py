"""Statements and transactions per step, counted inside the worker.

Imported by bench/flows.py in worker processes when ``GENEVA_BENCH_SQL_COUNT`` names a
directory: SQLAlchemy's ``before_cursor_execute`` (which the engine's compiled hot statements
fire too, engine/compiled.py), ``begin``, ``commit`` and ``rollback`` events are counted per
process, and after every commit or rollback the counts are rewritten to ``<dir>/<pid>.sql``
(one small write at offset 0, so a reader sees the last complete line). ``read`` sums the files;
the difference of two readings divided by the steps run between them is the per-step figure.
"""

from __future__ import annotations

import glob
import os
from typing import Any

FIELDS = ("statements", "begins", "commits", "rollbacks")
_counts = dict.fromkeys(FIELDS, 0)
_fd: int | None = None


def _flush() -> None:
    global _fd
    directory = os.environ.get("GENEVA_BENCH_SQL_COUNT")
    if not directory:
        return
    if _fd is None:
        _fd = os.open(
            os.path.join(directory, f"{os.getpid()}.sql"), os.O_WRONLY | os.O_CREAT, 0o644
        )
    line = " ".join(f"{_counts[k]:012d}" for k in FIELDS) + "\n"
    os.pwrite(_fd, line.encode(), 0)


def install() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def bump(name: str, flush: bool = False) -> Any:
        def listener(*_: Any, **__: Any) -> None:
            _counts[name] += 1
            if flush:
                _flush()

        return listener

    event.listen(Engine, "before_cursor_execute", bump("statements"))
    event.listen(Engine, "begin", bump("begins"))
    event.listen(Engine, "commit", bump("commits", flush=True))
    event.listen(Engine, "rollback", bump("rollbacks", flush=True))


def read(directory: str) -> dict[str, int]:
    """The counts of every worker process so far, summed."""
    total = dict.fromkeys(FIELDS, 0)
    for path in glob.glob(os.path.join(directory, "*.sql")):
        with open(path) as fh:
            values = fh.readline().split()
        if len(values) == len(FIELDS):
            for key, value in zip(FIELDS, values, strict=True):
                total[key] += int(value)
    return total
