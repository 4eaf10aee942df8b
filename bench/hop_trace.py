"""Where a hop goes: timestamps at each phase boundary of the executor, inside the worker.

Imported by bench/flows.py in worker processes when ``GENEVA_BENCH_TRACE=1``; every phase
boundary appends ``<tag> <execution id> <wall time>`` to ``GENEVA_BENCH_TIMINGS/trace-<pid>.txt``.
``segments`` turns those lines plus the step bodies' own timings into per-segment medians, for a
published hop:

    body end → finalize lock → finalize work → finalize commit (incl. the after-commit publish)
    → message received by the worker → task started in a pool process → prepare lock
    → prepare work → prepare commit → body start

and for an inline successor (no message): body end → finalize lock → finalize work
→ finalize commit → the successor's lock → prepare work → prepare commit → body start.

Diagnostic only (each trace point costs a file append, ~0.05 ms): B2/B3 figures come from runs
without it.
"""

from __future__ import annotations

import glob
import os
import statistics
import time
from collections import defaultdict
from typing import Any


def _trace(tag: str, execution_id: Any) -> None:
    directory = os.environ.get("GENEVA_BENCH_TIMINGS")
    if directory:
        with open(os.path.join(directory, f"trace-{os.getpid()}.txt"), "a") as fh:
            fh.write(f"{tag} {execution_id} {time.time()!r}\n")


def install() -> None:
    import celery.signals

    from geneva_drive import executor

    @celery.signals.task_received.connect(weak=False)
    def _received(request: Any = None, **_: Any) -> None:
        if request is not None and request.args:
            _trace("received", request.args[0])

    @celery.signals.task_prerun.connect(weak=False)
    def _prerun(args: Any = None, **_: Any) -> None:
        if args:
            _trace("prerun", args[0])

    cls: Any = executor.Executor

    def wrap(name: str, tag: str) -> None:
        original = getattr(cls, name)

        def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
            _trace(f"{tag}0", self.execution_id)
            try:
                return original(self, *args, **kwargs)
            finally:
                _trace(f"{tag}1", self.execution_id)

        setattr(cls, name, traced)

    wrap("_lock", "lock")  # twice per execution: prepare's, then finalize's
    wrap("_commit", "commit")


SEGMENTS = [
    ("body end → finalize lock taken", "body_end", "relock1"),
    ("finalize work (result, next execution)", "relock1", "fcommit0"),
    ("finalize commit + publish", "fcommit0", "fcommit1"),
    ("Redis → worker received", "fcommit1", "received"),
    ("received → pool process starts task", "received", "prerun"),
    ("task start → prepare lock taken", "prerun", "lock1"),
    ("prepare work (checks, start transition)", "lock1", "pcommit0"),
    ("prepare commit", "pcommit0", "pcommit1"),
    ("prepare commit → body start", "pcommit1", "body_start"),
]

#: An inline successor: no message, so no "received" or "prerun" marks; the same
#: worker goes from the finalize commit straight to the successor's claim.
INLINE_SEGMENTS = [
    ("body end → finalize lock taken", "body_end", "relock1"),
    ("finalize work (result, next execution)", "relock1", "fcommit0"),
    ("finalize commit", "fcommit0", "fcommit1"),
    ("finalize commit → successor's lock taken (new session)", "fcommit1", "lock1"),
    ("prepare work (checks, start transition)", "lock1", "pcommit0"),
    ("prepare commit", "pcommit0", "pcommit1"),
    ("prepare commit → body start", "pcommit1", "body_start"),
]


def segments(directory: str, hops: list[tuple[int, int, float, float]]) -> dict[str, Any]:
    """``hops``: (previous execution id, next execution id, previous body end, next body start)."""
    points: dict[tuple[int, str], list[float]] = defaultdict(list)
    for path in glob.glob(os.path.join(directory, "trace-*.txt")):
        with open(path) as fh:
            for line in fh:
                tag, eid, at = line.split()
                points[(int(eid), tag)].append(float(at))
    values: dict[str, dict[str, list[float]]] = {
        "published": defaultdict(list),
        "inline": defaultdict(list),
    }
    for prev, nxt, end, start in hops:
        try:
            marks = {
                "body_end": end,
                "relock1": points[(prev, "lock1")][1],
                "fcommit0": points[(prev, "commit0")][1],
                "fcommit1": points[(prev, "commit1")][1],
                "lock1": points[(nxt, "lock1")][0],
                "pcommit0": points[(nxt, "commit0")][0],
                "pcommit1": points[(nxt, "commit1")][0],
                "body_start": start,
            }
        except (KeyError, IndexError):
            continue
        if (nxt, "received") in points and (nxt, "prerun") in points:
            marks["received"] = points[(nxt, "received")][0]
            marks["prerun"] = points[(nxt, "prerun")][0]
            kind, segments_of_kind = "published", SEGMENTS
        else:
            kind, segments_of_kind = "inline", INLINE_SEGMENTS
        for label, a, b in segments_of_kind:
            values[kind][label].append((marks[b] - marks[a]) * 1000)
        values[kind]["whole hop"].append((start - end) * 1000)
    return {
        f"{kind}: {label}": {"p50_ms": round(statistics.median(v), 3), "n": len(v)}
        for kind, by_label in values.items()
        for label, v in by_label.items()
    }
