"""UserErasureWorkflow: export and notice, a 30-day grace period, anonymized posts and the
member deleted last; withdrawing the request during the grace period cancels it."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from geneva_drive.examples.erasure import ANONYMOUS, ERASED_BODY, UserErasureWorkflow
from geneva_drive.examples.models import DemoMember, DemoPost
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import (
    assert_step_executed,
    assert_workflow_state,
    perform_next_step,
    speedrun_workflow,
)


def _start(session):
    member = DemoMember(email="grace@example.com", name="Grace")
    session.add(member)
    session.flush()
    session.add_all(
        DemoPost(member_id=member.id, author_name=member.name, body=f"post {n}") for n in range(3)
    )
    # Someone else's post stays as it is.
    other = DemoMember(email="alan@example.com", name="Alan")
    session.add(other)
    session.flush()
    session.add(DemoPost(member_id=other.id, author_name=other.name, body="hello"))
    session.flush()
    return UserErasureWorkflow.create(hero=member, session=session), member.id, other.id


def _posts_of(session, member_id):
    return session.scalar(
        select(func.count()).select_from(DemoPost).where(DemoPost.member_id == member_id)
    )


def test_erases_the_member_after_the_grace_period(geneva_session):
    s = geneva_session
    wf, member_id, other_id = _start(s)

    assert perform_next_step(wf).step_name == "send_export"
    assert s.get(DemoMember, member_id).export_sent is True
    grace = wf.current_execution
    assert grace.step_name == "anonymize_posts"
    assert grace.scheduled_for - utcnow() > timedelta(days=29, hours=23)
    assert _posts_of(s, member_id) == 3  # nothing erased during the grace period

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")  # finished, not canceled: deletion is the last step
    assert_step_executed(wf, "anonymize_posts")
    assert_step_executed(wf, "erase_member")
    s.expire_all()
    assert s.get(DemoMember, member_id) is None
    assert _posts_of(s, member_id) == 0
    anonymized = list(s.scalars(select(DemoPost).where(DemoPost.member_id.is_(None))))
    assert len(anonymized) == 3
    assert {(p.author_name, p.body) for p in anonymized} == {(ANONYMOUS, ERASED_BODY)}
    assert "Grace" not in {p.author_name for p in s.scalars(select(DemoPost))}
    # The other member and their post are untouched.
    assert s.get(DemoMember, other_id).name == "Alan"
    assert _posts_of(s, other_id) == 1


def test_a_withdrawn_request_cancels_before_anything_is_erased(geneva_session):
    s = geneva_session
    wf, member_id, _ = _start(s)
    perform_next_step(wf)  # send_export; the grace period starts

    s.get(DemoMember, member_id).erasure_withdrawn = True
    s.commit()
    speedrun_workflow(wf)
    assert_workflow_state(wf, "canceled")
    assert_step_executed(wf, "anonymize_posts", "canceled")
    ran = s.scalar(
        select(func.count())
        .select_from(StepExecution)
        .where(StepExecution.workflow_id == wf.id, StepExecution.step_name == "erase_member")
    )
    assert ran == 0
    s.expire_all()
    member = s.get(DemoMember, member_id)
    assert member is not None and member.name == "Grace"
    assert _posts_of(s, member_id) == 3
    assert "Grace" in {p.author_name for p in s.scalars(select(DemoPost))}


def test_a_new_request_can_start_once_a_withdrawn_one_was_canceled(geneva_session):
    s = geneva_session
    wf, member_id, _ = _start(s)
    perform_next_step(wf)
    member = s.get(DemoMember, member_id)
    member.erasure_withdrawn = True
    s.commit()
    speedrun_workflow(wf)
    assert_workflow_state(wf, "canceled")

    # The member asks again: the canceled workflow no longer holds the hero's slot.
    member = s.get(DemoMember, member_id)
    member.erasure_withdrawn = False
    again = UserErasureWorkflow.create(hero=member, session=s)
    speedrun_workflow(again)
    assert_workflow_state(again, "finished")
    s.expire_all()
    assert s.get(DemoMember, member_id) is None
