"""The raw Celery peer's app (worker and producer import it). Adapted from the Celery app of the
original peer benchmark scripts (2026-11-29), configured like engine/celery.py (acks_late, prefetch
1, no result backend) so the ratio compares transports, not settings.

Each no-op task appends ``<tag> <idx> <step> <t_enqueue> <t_start> <t_end>`` to
``BENCH_TIMING_DIR/<pid>.log``.
"""

import os
import time

from celery import Celery

app = Celery("rawbench", broker=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14"))
app.conf.update(
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="bench_raw",
)
_fh = None


def _sink():
    global _fh
    if _fh is None:
        directory = os.environ["BENCH_TIMING_DIR"]
        _fh = open(os.path.join(directory, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    return _fh


@app.task(name="bench.noop")
def noop(tag, idx, step, t_enq):
    t_start = time.time()
    _sink().write(f"{tag} {idx} {step} {t_enq!r} {t_start!r} {time.time()!r}\n")
