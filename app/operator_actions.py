"""The dashboard's side of the operator actions: the engine's
:mod:`geneva_drive.operator_actions` on the request's session, a 404 for an unknown workflow,
and the background runner for bulk actions over the cap (a thread with the app's context).

Everything else (the actions, refusals, caps, audit rows, bulk outcomes and previews) lives in
the engine, where the ``geneva-drive workflows …`` commands use it without Flask. The engine's
names are re-exported here for the callers that import them from this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flask import abort, current_app

from geneva_drive import operator_actions as engine_actions
from geneva_drive.dashboard.extensions import db
from geneva_drive.operator_actions import (
    ACTIONS,
    AUDIT_REFUSED_VALUE_LIMIT,
    BACKGROUND_CHUNK,
    BACKGROUND_IDS_LISTED,
    BAD_INPUT,
    WAITING_ONLY,
    ActionResult,
    BulkPreview,
    BulkResult,
    parse_payload,
    preview_bulk,
)

__all__ = [
    "ACTIONS",
    "AUDIT_REFUSED_VALUE_LIMIT",
    "BACKGROUND_CHUNK",
    "BACKGROUND_IDS_LISTED",
    "BAD_INPUT",
    "WAITING_ONLY",
    "ActionResult",
    "BulkPreview",
    "BulkResult",
    "parse_payload",
    "perform",
    "perform_bulk",
    "preview_bulk",
    "start_background_bulk",
]


def perform(
    actor: str,
    workflow_id: int,
    action: str,
    params: dict[str, Any] | None = None,
    *,
    audit_extra: dict[str, Any] | None = None,
    prepare: Callable[[], Any] | None = None,
    missing_ok: bool = False,
) -> ActionResult:
    """:func:`geneva_drive.operator_actions.perform` on the request's session; 404 when the
    workflow does not exist (with ``missing_ok``, the result with ``gone`` set instead)."""
    result = engine_actions.perform(
        db.session(), actor, workflow_id, action, params, audit_extra=audit_extra, prepare=prepare
    )
    if result.gone and not missing_ok:
        abort(404, description=result.message)
    return result


def perform_bulk(
    actor: str, ids: list[int], action: str, params: dict[str, Any], selection: dict[str, Any]
) -> BulkResult:
    """:func:`geneva_drive.operator_actions.perform_bulk` on the request's session."""
    return engine_actions.perform_bulk(db.session(), actor, ids, action, params, selection)


def start_background_bulk(
    actor: str, action: str, params: dict[str, Any], filters: Any, selection: dict[str, Any]
) -> int:
    """Run a bulk action over a selection above the cap in a background thread; return the
    batch audit row's id, whose ``params`` carry the progress (``done``, ``refused``).

    A thread of the web process, not a queue: the work is bounded (one engine call per
    workflow) and its progress is in the database, so a restart mid-way leaves a "running"
    batch row and an operator who runs the same filter again. Each workflow is still its own
    transaction with its own audit row, exactly like a bulk action under the cap.
    """
    from geneva_drive.dashboard import queries

    batch_id = engine_actions.start_batch(
        db.session(),
        actor,
        action,
        params,
        {**selection, "background": True, "done": 0, "refused": 0},
        message="Running in the background.",
    )
    app = current_app._get_current_object()  # type: ignore[attr-defined]

    def next_ids(session: Any, before: int | None) -> list[int]:
        return queries.ids_before(session, filters, before, BACKGROUND_CHUNK)

    def run() -> None:
        with app.app_context():
            try:
                engine_actions.run_background_batch(
                    db.session(), actor, action, params, batch_id, next_ids
                )
            finally:
                db.session.remove()

    thread = threading.Thread(target=run, name=f"geneva-bulk-{batch_id}", daemon=True)
    app.extensions.setdefault("geneva_bulk_threads", {})[batch_id] = thread
    thread.start()
    return batch_id
