"""Messages leave only after the creating transaction commits, and a savepoint that rolls
back drops only the messages queued inside it."""

from __future__ import annotations

import pytest

from geneva_drive import with_inline_enqueue
from geneva_drive.transport import Message, pending_count, queue_message


def test_messages_are_sent_only_after_commit(geneva_session, geneva_transport):
    queue_message(geneva_session, Message(1, "a"))
    assert geneva_transport.execution_ids == []
    geneva_session.commit()
    assert geneva_transport.execution_ids == [1]


def test_rollback_sends_nothing(geneva_session, geneva_transport):
    queue_message(geneva_session, Message(1, "a"))
    geneva_session.rollback()
    geneva_session.commit()
    assert geneva_transport.execution_ids == []
    assert pending_count(geneva_session) == 0


def test_savepoint_rollback_keeps_the_outer_transactions_messages(geneva_session, geneva_transport):
    queue_message(geneva_session, Message(1, "outer"))
    with pytest.raises(ValueError), geneva_session.begin_nested():
        queue_message(geneva_session, Message(2, "inner"))
        raise ValueError("undo the savepoint")
    with geneva_session.begin_nested():
        queue_message(geneva_session, Message(3, "released"))
    geneva_session.commit()
    assert geneva_transport.execution_ids == [1, 3]


def test_inline_enqueue_sends_at_once_and_restores(geneva_session, geneva_transport):
    with with_inline_enqueue():
        queue_message(geneva_session, Message(1, "now"))
        assert geneva_transport.execution_ids == [1]
    queue_message(geneva_session, Message(2, "later"))
    assert geneva_transport.execution_ids == [1]
    geneva_session.commit()
    assert geneva_transport.execution_ids == [1, 2]
