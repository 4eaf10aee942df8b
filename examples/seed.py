"""Demo data: a few hundred workflows in every state, driven there by the real executor.

:func:`seed` runs once per database (it does nothing when demo workflows exist already) and
leaves: scheduled work due now, soon and in days; overdue executions; payments parked for a
signal and one with a buffered signal; workflows paused after an error; workflows stranded
on a deleted step and executions in flight on a removed step (gravestone); finished and
canceled workflows; campaign chains part-way through their resumable step; erasures in their
grace period, done (the member deleted) and withdrawn (canceled); checkouts waiting for their
payment with a short time-out, paid, and abandoned (timed out, canceled); and a day of finished
history (feed imports spread over the last 24 hours, with reattempts and failures) for the charts.

:func:`run_ticker` keeps the demo alive: every couple of seconds it starts a new workflow and
confirms a parked payment, so the dashboard always has something moving and workflows finish
within seconds of the start; the oldest few parked payments are left for an operator to
confirm (:data:`KEEP_FOR_OPERATOR`). Every ``CHECKOUT_EVERY`` ticks it starts a checkout that
nobody pays: it times out (and is canceled) while you watch.
"""

from __future__ import annotations

import logging
import random
import threading
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from geneva_drive import db, executor, operator_actions
from geneva_drive.dispatch import fire_timeouts
from geneva_drive.examples import _work
from geneva_drive.examples.campaign import CampaignWorkflow
from geneva_drive.examples.checkout import PAYMENT_WINDOW, CheckoutWorkflow
from geneva_drive.examples.erasure import UserErasureWorkflow
from geneva_drive.examples.flaky import FeedImportWorkflow
from geneva_drive.examples.fulfilment import FulfilmentWorkflow, WarehouseWaveWorkflow
from geneva_drive.examples.models import (
    DemoCampaign,
    DemoCustomer,
    DemoFeed,
    DemoMember,
    DemoOrder,
    DemoPost,
    DemoSubscriber,
)
from geneva_drive.examples.onboarding import OnboardingWorkflow
from geneva_drive.examples.payment import PaymentWorkflow
from geneva_drive.examples.tenant_sync import TenantSyncWorkflow
from geneva_drive.instrumentation import set_error_reporter
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import CURRENT_STEP_STATES
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

DEMO_TYPES = [
    OnboardingWorkflow.workflow_name,
    PaymentWorkflow.workflow_name,
    CampaignWorkflow.workflow_name,
    FeedImportWorkflow.workflow_name,
    UserErasureWorkflow.workflow_name,
    CheckoutWorkflow.workflow_name,
    FulfilmentWorkflow.workflow_name,
    TenantSyncWorkflow.workflow_name,
]


def is_seeded() -> bool:
    with db.new_session() as session:
        found = session.scalar(select(Workflow.id).where(Workflow.type.in_(DEMO_TYPES)).limit(1))
    return found is not None


def seed(scale: float = 1.0, stop: threading.Event | None = None) -> int:
    """Create the demo workflows (``scale`` multiplies the counts); return how many.

    Every state is present from ``scale=0.1`` up (about 30 workflows; the default makes 268).

    ``stop`` ends seeding early (Ctrl-C while ``up --demo`` is still seeding).
    """
    if is_seeded():
        log.info("demo data already present; not seeding again")
        return 0
    global _stop
    _stop = stop
    rng = random.Random(42)
    _work.enabled = False  # no simulated latency while seeding
    # The flaky and broken feeds fail on purpose; their errors are on the executions.
    set_error_reporter(lambda error, context: None)
    try:
        created = 0
        for part in (
            _seed_onboarding,
            _seed_payments,
            _seed_campaigns,
            _seed_feeds,
            _seed_erasures,
            _seed_checkouts,
            _seed_fulfilments,
            _seed_failed_wave,
            _seed_tenant_syncs,
            _seed_tenant_flood,
            _seed_history,
        ):
            if stop is not None and stop.is_set():
                break
            created += part(rng, scale)
    finally:
        _work.enabled = True
        set_error_reporter(None)
    log.info("seeded %d demo workflows", created)
    return created


# --- helpers -------------------------------------------------------------------------------------

_stop: threading.Event | None = None


def _stopping() -> bool:
    return _stop is not None and _stop.is_set()


def _create(cls: type[Workflow], hero: Any) -> int:
    with db.transaction() as session:
        session.add(hero)
        session.flush()
        workflow = cls.create(hero=hero, session=session)
        return int(workflow.id)


def _current(workflow_id: int) -> StepExecution | None:
    with db.new_session() as session:
        return session.scalars(
            select(StepExecution)
            .where(
                StepExecution.workflow_id == workflow_id,
                StepExecution.state.in_([str(s) for s in CURRENT_STEP_STATES]),
            )
            .order_by(StepExecution.id)
            .limit(1)
        ).first()


def _advance(workflow_id: int, steps: int = 1, **options: Any) -> None:
    """Run the current execution ``steps`` times, whatever its scheduled time (like speedrun)."""
    for _ in range(steps):
        current = _current(workflow_id)
        if current is None or current.state != "scheduled":
            return
        try:
            executor.execute(current.id, **options)
        except Exception:
            # The step's own error: the executor recorded it on the execution (that is the
            # point of the "paused after an error" demo rows).
            pass


def _finish(workflow_id: int) -> None:
    _advance(workflow_id, 50, interruptible=False)


def _move_current(workflow_id: int, **values: Any) -> None:
    current = _current(workflow_id)
    if current is None:
        return
    with db.transaction() as session:
        session.execute(
            update(StepExecution).where(StepExecution.id == current.id).values(**values)
        )


#: Who the demo's seeded pauses and cancels are recorded as (the audit, the why-line's
#: "paused by …"): an operator at the command line, as a real one would be.
SEED_ACTOR = "cli:oncall"


def _operate(workflow_id: int, action: str) -> None:
    """``action`` as an operator performs it: through the engine's operator actions, audited."""
    with db.new_session() as session:
        result = operator_actions.perform(session, SEED_ACTOR, workflow_id, action)
    if not result.ok:
        raise RuntimeError(f"seeding: {action} of workflow #{workflow_id}: {result.message}")


# --- scenarios -----------------------------------------------------------------------------------


def _children_of(workflow_id: int) -> list[int]:
    with db.new_session() as session:
        return list(
            session.scalars(
                select(Workflow.id).where(Workflow.parent_id == workflow_id).order_by(Workflow.id)
            )
        )


def _seed_fulfilments(rng: random.Random, scale: float) -> int:
    """Orders fanned out to child workflows: one fully shipped and invoiced, and
    one whose lines are part-way (3 of 5 finished, 1 paused, 1 running) so its invoice waits."""
    count = 0
    for i in range(max(2, round(4 * scale))):
        if _stopping():
            break
        wf = _create(FulfilmentWorkflow, DemoOrder(amount_cents=rng.randint(1000, 90000)))
        _advance(wf, 2)  # ship (starts the lines), then invoice parks
        lines = _children_of(wf)
        count += 1 + len(lines)
        if i % 2 == 0:
            for line in lines:
                _finish(line)
            _finish(wf)  # the last line woke the invoice
        else:
            for line in lines[:3]:
                _finish(line)
            _operate(lines[3], "pause")
            _advance(lines[4], 1)  # picked, shipping is due
    return count


def _seed_failed_wave(rng: random.Random, scale: float) -> int:
    """A warehouse wave whose lines ran and a third of them paused after an error (the label
    printer was offline): the wave's why-line says "4 children paused after errors" first,
    each count linking to those children (docs/MANUAL.md, child workflows)."""
    wave = _create(WarehouseWaveWorkflow, DemoOrder(amount_cents=rng.randint(10_000, 90_000)))
    _advance(wave, 2)  # release (starts the lines), then invoice parks
    lines = _children_of(wave)
    for line in lines:
        _finish(line)  # ships, or pauses after LabelPrinterOffline
    return 1 + len(lines)


def _seed_onboarding(rng: random.Random, scale: float) -> int:
    now = utcnow()
    count = 0

    def customer(i: int) -> DemoCustomer:
        return DemoCustomer(email=f"user{i}@example.com", profile_complete=rng.random() < 0.3)

    for i in range(max(1, round(120 * scale))):
        if _stopping():
            break
        wf = _create(OnboardingWorkflow, customer(i))
        count += 1
        bucket = i % 12
        if bucket in (0, 1):
            pass  # ready, first step due now
        elif bucket in (2, 3, 4):
            _advance(wf, 1)  # nudge scheduled in 20 s
        elif bucket in (5, 6, 7):
            _advance(wf, 2)  # tips scheduled in two days
        elif bucket == 8:
            _advance(wf, 2)  # overdue: its time passed while no worker ran
            _move_current(wf, scheduled_for=now - timedelta(minutes=rng.randint(3, 90)))
        elif bucket == 9:
            _finish(wf)
        elif bucket == 10:
            if (i // 12) % 2 == 1:
                _operate(wf, "cancel")
            else:
                # Stranded: the step after send_welcome (send_sms) was deleted without a
                # gravestone; the run pauses it. /stranded shows the gap after send_welcome.
                _advance(wf, 1)
                _move_current(wf, step_name="send_sms")
                _advance(wf, 1)
        else:
            _advance(wf, 1)  # in flight on the removed step: drains when due
            _move_current(wf, step_name="send_fax", scheduled_for=now + timedelta(hours=6))
    return count


def _seed_payments(rng: random.Random, scale: float) -> int:
    count = 0
    for i in range(max(1, round(80 * scale))):
        if _stopping():
            break
        order = DemoOrder(amount_cents=rng.randint(500, 50_000), voided=False)
        wf = _create(PaymentWorkflow, order)
        count += 1
        bucket = i % 8
        if bucket in (0, 1, 2, 3):
            _advance(wf, 2)  # parked, waiting for payment_confirmed
        elif bucket == 4:
            _advance(wf, 2)
            _signal(wf, order.amount_cents)
            _finish(wf)
        elif bucket == 5:
            _signal(wf, order.amount_cents)  # buffered before the gate is reached
        elif bucket == 6:
            _operate(wf, "cancel")
        else:
            _advance(wf, 2)
            _operate(wf, "pause")
    return count


def _signal(workflow_id: int, amount_cents: int) -> None:
    with db.transaction() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        workflow.signal(
            "payment_confirmed",
            {"amount_cents": amount_cents},
            idempotency_key=f"evt_{workflow_id}",
        )


def _seed_campaigns(rng: random.Random, scale: float) -> int:
    count = 0
    for i in range(max(1, round(12 * scale))):
        if _stopping():
            break
        with db.transaction() as session:
            campaign = DemoCampaign(name=f"Spring sale #{i + 1}", delivered=0)
            session.add(campaign)
            session.flush()
            session.add_all(
                DemoSubscriber(campaign_id=campaign.id, email=f"s{n}@c{campaign.id}.example")
                for n in range(100)
            )
            campaign_id = campaign.id
        with db.transaction() as session:
            hero = session.get(DemoCampaign, campaign_id)
            wf = int(CampaignWorkflow.create(hero=hero, session=session).id)
        count += 1
        if i % 3 == 0:
            _advance(wf, 3)  # prepare, then two links of the deliver chain
        elif i % 3 == 1:
            _finish(wf)
    return count


def _seed_feeds(rng: random.Random, scale: float) -> int:
    count = 0
    for i in range(max(1, round(40 * scale))):
        if _stopping():
            break
        kind = ("healthy", "flaky", "broken", "broken")[i % 4]
        wf = _create(FeedImportWorkflow, DemoFeed(url=f"https://feeds.example/{i}.csv", kind=kind))
        count += 1
        if kind == "broken":
            _advance(wf, 2)  # fetch, then parse fails: paused with the error
        elif kind == "flaky":
            _advance(wf, 1)  # timed out once: reattempt scheduled in 5 s
        elif i % 8 == 0:
            _finish(wf)
    return count


def _seed_erasures(rng: random.Random, scale: float) -> int:
    count = 0
    for i in range(max(4, round(16 * scale))):
        if _stopping():
            break
        with db.transaction() as session:
            member = DemoMember(email=f"member{i}@forum.example", name=f"Member {i + 1}")
            session.add(member)
            session.flush()
            session.add_all(
                DemoPost(member_id=member.id, author_name=member.name, body=f"Post {n} by {i}")
                for n in range(rng.randint(1, 4))
            )
            wf = int(UserErasureWorkflow.create(hero=member, session=session).id)
            member_id = member.id
        count += 1
        bucket = i % 4
        if bucket in (0, 1):
            _advance(wf, 1)  # export sent: in the 30-day grace period
        elif bucket == 2:
            _finish(wf)  # posts anonymized, member deleted
        else:
            _advance(wf, 1)  # withdrawn during the grace period: canceled when the step runs
            with db.transaction() as session:
                withdrawn = session.get(DemoMember, member_id)
                assert withdrawn is not None
                withdrawn.erasure_withdrawn = True
            _advance(wf, 1)
    return count


def _seed_checkouts(rng: random.Random, scale: float) -> int:
    """Abandoned checkouts (timed out, canceled), a paid one, and a few still waiting: their
    time-outs fire within ``PAYMENT_WINDOW`` of the seed, in the running demo's sweep."""
    count = 0
    abandoned, paid, waiting = max(1, round(4 * scale)), 1, max(1, round(3 * scale))
    for i in range(abandoned + paid + waiting):
        if _stopping():
            break
        order = DemoOrder(amount_cents=rng.randint(500, 50_000), voided=False)
        wf = _create(CheckoutWorkflow, order)
        count += 1
        _advance(wf, 2)  # reserve_stock, then capture parks with its deadline
        if i < abandoned:
            # Its window is over: what the dispatcher's sweep does once the deadline passed
            # (it parked a window ago, so its line says "after 1 min 15 s", not "after 0 s").
            now = utcnow()
            _move_current(wf, timeout_at=now, waiting_since=now - PAYMENT_WINDOW)
            fire_timeouts()
        elif i < abandoned + paid:
            _signal(wf, order.amount_cents)
            _finish(wf)
    return count


#: Tenants of the tenant-sync demo: (e-mail domain, syncs started, left running).
SYNC_TENANTS = (("acme.example", 9, 2), ("globex.example", 4, 1), ("initech.example", 3, 0))


def _seed_tenant_syncs(rng: random.Random, scale: float) -> int:
    """A backlog under the ``tenant-sync`` limit (2 at once per tenant): acme's two slots are
    taken by syncs running right now (a worker is on them), and its other syncs, deferred by
    the real claim, wait in line for a slot; globex runs one and has room; initech's finished.
    On ``up --demo`` the running ones end when stuck recovery reattempts them (their worker is
    the seed, gone), which frees the slots and wakes acme's line, oldest first."""
    count = 0
    for domain, started, running in SYNC_TENANTS:
        ids = []
        for i in range(max(running + 1, round(started * scale)) if running else started):
            if _stopping():
                return count
            ids.append(_create(TenantSyncWorkflow, DemoCustomer(email=f"sync{i}@{domain}")))
            count += 1
        for workflow_id in ids[:running]:
            # A worker is running its pull: the slot it holds is what the others wait for.
            _move_current(workflow_id, state="in_progress", started_at=utcnow())
            with db.transaction() as session:
                session.execute(
                    update(Workflow)
                    .where(Workflow.id == workflow_id)
                    .values(state="performing", current_step_name="pull")
                )
        for workflow_id in ids[running:]:
            if running == 0:
                _finish(workflow_id)
            else:
                _advance(workflow_id, 1)  # deferred if the tenant's slots are taken
    return count


#: The tenant that floods ``tenant-sync``: an import started all its syncs at once, this long ago.
FLOOD_TENANT = "megacorp.example"
FLOOD_SYNCS = 60
FLOOD_AGE = timedelta(minutes=17)


def _seed_tenant_flood(rng: random.Random, scale: float) -> int:
    """A tenant flooding the ``tenant-sync`` limit (2 at once per tenant), 17 minutes in: a few
    syncs pulled at once (the pace /limits drains the rest at, and the history that makes a
    ``pull`` of milliseconds usual), its two slots held by pulls running for 17 minutes (far
    past that usual), half of the rest deferred by the real claim 17 minutes ago (held back
    late, the limit named), the others due since then and not tried yet."""
    count = 0
    ids = []
    for i in range(max(12, round(FLOOD_SYNCS * scale))):
        if _stopping():
            return count
        ids.append(_create(TenantSyncWorkflow, DemoCustomer(email=f"user{i}@{FLOOD_TENANT}")))
        count += 1
    pulled, running, rest = ids[:6], ids[6:8], ids[8:]
    deferred, due = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    for workflow_id in pulled:
        _advance(workflow_id, 1)  # its push is then due under the tenant's slots too
    since = utcnow() - FLOOD_AGE
    for workflow_id in running:
        _move_current(workflow_id, state="in_progress", started_at=since)
        with db.transaction() as session:
            session.execute(
                update(Workflow)
                .where(Workflow.id == workflow_id)
                .values(state="performing", current_step_name="pull")
            )
    for workflow_id in deferred:
        _advance(workflow_id, 1)  # both slots taken: deferred
        _move_current(workflow_id, deferred_since=since)
    for workflow_id in due:
        _move_current(workflow_id, scheduled_for=since)
    return count


#: Hours of finished history the demo carries (the overview's day chart and the failures page).
HISTORY_HOURS = 24


def _seed_history(rng: random.Random, scale: float) -> int:
    """A day of finished work: feed imports run now by the real executor, then moved back in
    time (every timestamp of the workflow and its executions shifted together) so they spread
    over the last 24 hours, two or three an hour plus a busy last hour. Flaky feeds leave
    reattempted executions; every sixth hour a broken feed fails and an operator cancels it,
    so the charts and the failure triage show failures without adding paused workflows."""
    count = 0
    per_hour = max(1, round(2 * scale))
    for hours_ago in range(HISTORY_HOURS):
        if _stopping():
            break
        runs = per_hour + (3 if hours_ago == 0 else 0) + rng.randint(0, 1)
        for n in range(runs):
            broken = hours_ago % 6 == 3 and n == 0
            kind = "broken" if broken else ("flaky" if rng.random() < 0.3 else "healthy")
            feed = DemoFeed(url=f"https://feeds.example/history/{hours_ago}-{n}.csv", kind=kind)
            wf = _create(FeedImportWorkflow, feed)
            count += 1
            _finish(wf)
            if broken:
                _operate(wf, "cancel")
            # Minutes into the hour: the last hour's runs stay in the past (up to 55 min ago).
            back = timedelta(
                hours=hours_ago, minutes=rng.randint(2, 55), seconds=rng.randint(0, 59)
            )
            _shift(wf, back)
    return count


_EXECUTION_TIMES = (
    "created_at",
    "updated_at",
    "scheduled_for",
    "started_at",
    "completed_at",
    "failed_at",
    "canceled_at",
    "skipped_at",
    "finished_at",
    "waiting_since",
)


def _shift(workflow_id: int, back: timedelta) -> None:
    """Move a finished workflow and its executions ``back`` in time, all stamps together."""
    with db.transaction() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        values = {
            name: getattr(workflow, name) - back
            for name in ("created_at", "updated_at", "transitioned_at")
            if getattr(workflow, name, None) is not None
        }
        session.execute(update(Workflow).where(Workflow.id == workflow_id).values(**values))
        executions = session.scalars(
            select(StepExecution).where(StepExecution.workflow_id == workflow_id)
        ).all()
        for execution in executions:
            moved = {
                name: getattr(execution, name) - back
                for name in _EXECUTION_TIMES
                if getattr(execution, name, None) is not None
            }
            session.execute(
                update(StepExecution).where(StepExecution.id == execution.id).values(**moved)
            )


# --- keep it moving ------------------------------------------------------------------------------


def run_ticker(stop: threading.Event, every: float = 2.0) -> None:
    """Start a workflow and confirm a parked payment every ``every`` seconds until stopped."""
    rng = random.Random()
    n = 0
    # A healthy feed right away: fetch, parse, publish finish within a second or two of the
    # start, so the pages move before the first tick.
    try:
        _create(FeedImportWorkflow, DemoFeed(url="https://feeds.example/t0", kind="healthy"))
    except Exception:
        log.exception("demo ticker failed; continuing")
    while not stop.wait(every):
        n += 1
        try:
            kind = n % 3
            if kind == 0:
                _create(OnboardingWorkflow, DemoCustomer(email=f"new{n}@example.com"))
            elif kind == 1:
                _create(PaymentWorkflow, DemoOrder(amount_cents=rng.randint(500, 50_000)))
            else:
                feed_kind = rng.choice(["healthy", "healthy", "flaky", "broken"])
                _create(
                    FeedImportWorkflow, DemoFeed(url=f"https://feeds.example/t{n}", kind=feed_kind)
                )
            if n % CHECKOUT_EVERY == 0:
                # Nobody pays this one: it times out while you watch (PAYMENT_WINDOW).
                _create(CheckoutWorkflow, DemoOrder(amount_cents=rng.randint(500, 50_000)))
            _confirm_a_parked_payment(rng)
        except Exception:
            log.exception("demo ticker failed; continuing")


#: Ticks between two checkouts the ticker starts and nobody pays.
CHECKOUT_EVERY = 10

#: Parked, ready payments the ticker never confirms: the oldest few wait for a payment only an
#: operator sends ("Send signal" in the inbox), so a newcomer always finds one to try.
KEEP_FOR_OPERATOR = 5


def _confirm_a_parked_payment(rng: random.Random) -> None:
    with db.new_session() as session:
        parked = list(
            session.scalars(
                select(StepExecution.workflow_id)
                .join(Workflow, Workflow.id == StepExecution.workflow_id)
                .where(
                    StepExecution.state == "waiting",
                    Workflow.type == PaymentWorkflow.workflow_name,
                    Workflow.state == "ready",
                )
                .order_by(StepExecution.workflow_id)
                .limit(KEEP_FOR_OPERATOR + 20)
            )
        )[KEEP_FOR_OPERATOR:]
    if parked:
        workflow_id = rng.choice(parked)
        with db.new_session() as session:
            workflow = session.get(Workflow, workflow_id)
            hero = workflow.hero if workflow is not None else None
            amount = hero.amount_cents if hero is not None else 1000
        _signal(workflow_id, amount)
