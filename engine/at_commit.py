"""Work a transaction leaves for its commit, kept per session.

Three parts of the engine collect what a transaction will do when it commits, instead of doing
it statement by statement: the messages to send (:mod:`geneva_drive.transport`), the changes
to the per-state counts (:mod:`geneva_drive.counts`) and the children a step started
(:mod:`geneva_drive.children`). Each item remembers the transactions that were open when it
was added (the innermost savepoint and its parents), so

* a savepoint that rolls back drops the items added inside it, as its rows go, and keeps those
  of the enclosing transaction;
* a root transaction that ends without committing (rolled back, or the session closed) drops
  them all.

An owner whose items become writes of the transaction passes ``write``: the one
``before_commit`` listener below flushes the session, then hands each such queue its items, in
``order`` (lowest first), before the commit's own flush. The order is the lock order: the
children's counters (a workflow row) come before the per-state counts, whose row locks every
transaction takes last and holds only for its commit. What must only follow a durable commit
(the messages) the owner takes in its own ``after_commit``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session

T = TypeVar("T")

_queues: list[AtCommit[Any]] = []


def _transaction_chain(session: Session) -> tuple[Any, ...]:
    """The innermost open transaction (savepoint or root) and all its parents."""
    if session.get_transaction() is None:
        session.begin()  # what autobegin would do at the first statement
    innermost = session.get_nested_transaction() or session.get_transaction()
    chain = []
    while innermost is not None:
        chain.append(innermost)
        innermost = innermost.parent
    return tuple(chain)


class AtCommit(Generic[T]):
    """Items of type ``T`` that a session's transaction collects for its commit, under
    ``session.info[key]``."""

    def __init__(
        self,
        key: str,
        *,
        write: Callable[[Session, list[T]], None] | None = None,
        order: int = 0,
    ) -> None:
        self.key = key
        self.write = write
        self.order = order
        _queues.append(self)
        _queues.sort(key=lambda queue: queue.order)

    def add(self, session: Session, item: T) -> None:
        self.extend(session, (item,))

    def extend(self, session: Session, items: Iterable[T]) -> None:
        chain = _transaction_chain(session)
        queue: list[tuple[tuple[Any, ...], T]] = session.info.setdefault(self.key, [])
        queue.extend((chain, item) for item in items)

    def items(self, session: Session) -> list[T]:
        """What is queued now, oldest first (kept)."""
        return [item for _chain, item in session.info.get(self.key, ())]

    def take(self, session: Session) -> list[T]:
        """What is queued now, oldest first; the queue is empty afterwards."""
        return [item for _chain, item in session.info.pop(self.key, ())]

    def has_any(self, session: Session) -> bool:
        """Whether anything is queued."""
        return bool(session.info.get(self.key))

    def _drop_inside(self, session: Session, transaction: Any) -> None:
        queue = session.info.get(self.key)
        if not queue:
            return
        kept = [(chain, item) for chain, item in queue if transaction not in chain]
        if kept:
            session.info[self.key] = kept
        else:
            session.info.pop(self.key, None)


@event.listens_for(Session, "before_commit")
def _write_at_commit(session: Session) -> None:
    if session.get_nested_transaction() is not None:
        return  # a savepoint released: the enclosing transaction may still roll back
    # The commit flushes after this hook; flush first, so that what that flush writes is queued
    # too. (Nothing to write: returns at once.)
    session.flush()
    for queue in _queues:
        if queue.write is not None and queue.has_any(session):
            queue.write(session, queue.take(session))


@event.listens_for(Session, "after_soft_rollback")
def _drop_after_rollback(session: Session, previous_transaction: Any) -> None:
    for queue in _queues:
        queue._drop_inside(session, previous_transaction)


@event.listens_for(Session, "after_transaction_end")
def _drop_at_end(session: Session, transaction: Any) -> None:
    # A root transaction that committed was emptied by its owners at the commit; one that
    # ended otherwise (closed, or rolled back) leaves nothing behind.
    if transaction.parent is None:
        for queue in _queues:
            session.info.pop(queue.key, None)


__all__ = ["AtCommit"]
