"""Delivering events to webhooks: claim what is due, send each attempt signed, record its outcome.

A Deliverer runs in `leadsvc serve` (a background thread) and in `leadsvc worker`. It claims due
deliveries in one short transaction that moves their `next_attempt_at` to the end of a lease
and counts the attempt (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: the write lock), so any
number of processes on one database never send the same attempt twice. The HTTP request runs
outside any transaction, on a small pool of sender threads with keep-alive connections, of which
one workspace and one destination hold at most a few at once (webhooks.per_workspace, per_host),
each for at most webhooks.timeout, unless their receivers answer quickly and slots are spare
(lending, below); each outcome is recorded in its own transaction, fenced by the
attempt number. A process that dies mid-attempt leaves the claim to lapse, and the delivery is
sent again (at least once).

Where an attempt may go, and the HTTP request itself, are outbound.py's.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable
from urllib.parse import urlsplit

from . import events
from .db import NO_KEY_UPDATE, UNAVAILABLE_ERRORS, database, for_update, is_postgres, transaction
from .models import Delivery, Event, Webhook, utcnow
from .outbound import Answer, Sender

log = logging.getLogger("leadsvc.delivery")

# Seconds from each failed attempt to the next; after the last, the delivery is dead.
SCHEDULE = (5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600, 24 * 3600, 24 * 3600)
JITTER = 0.2
MAX_RETRY_AFTER = 24 * 3600       # a Retry-After longer than the longest step is taken as that step
DISABLE_AFTER = timedelta(days=3)  # of failures only, with no success in between
USER_AGENT = "leadsvc/{version}"
SENDERS = 8            # attempts a delivering process makes at once, each on its own thread and connection
# Due deliveries a claim reads per free sender to choose from: enough that workspaces and hosts at
# their cap, skipped, leave others to choose.
CANDIDATES_PER_SENDER = 8
# A destination whose last answer came within this many seconds may borrow spare sender slots past
# the caps: a lent slot is back soon, so a lone workspace's backlog to a quick receiver uses the
# whole pool while another workspace still finds a slot at once or within this time.
QUICK_ANSWER = 1.0
# How often a delivering process looks for deliveries that other processes wrote (its own commits
# wake it at once).
POLL_SECONDS = 0.25


# --- the schedule ----------------------------------------------------------------------------

def next_delay(failures: int, answer: Answer, rng: Callable[[], float]) -> float | None:
    """Seconds until the attempt after this many failures (None: no more attempts)."""
    if failures > len(SCHEDULE):
        return None
    if answer.status in (429, 503) and answer.retry_after is not None:
        return min(answer.retry_after, MAX_RETRY_AFTER)
    return SCHEDULE[failures - 1] * (1 + JITTER * (2 * rng() - 1))


# --- the deliverer ---------------------------------------------------------------------------

@dataclass
class Claimed:
    """A delivery leased for one attempt: its attempt number and lease end fence what is recorded."""

    delivery: Delivery
    attempt: int
    lease_until: datetime
    holds: tuple = ()   # the workspace and destination whose sender slots the attempt counts against


def destination(url: str) -> tuple[str, ...]:
    """Where a webhook's attempts go, for the per-host cap: host and port (a URL that does not
    parse is its own destination; its attempt fails at once)."""
    try:
        parts = urlsplit(url)
        return ("host", (parts.hostname or "").lower(), str(parts.port or (443 if parts.scheme == "https" else 80)))
    except ValueError:
        return ("host", url)


class Deliverer:
    """Claims due deliveries and sends them on SENDERS threads until stopped."""

    def __init__(self, settings: dict[str, Any], *, version: str, metrics: Any = None,
                 clock: Callable[[], datetime] = utcnow, rng: Callable[[], float] = random.random):
        self.settings = settings["webhooks"]
        self.metrics = metrics
        self.clock, self.rng = clock, rng
        self.user_agent = USER_AGENT.format(version=version)
        self.sender = Sender(self.settings)
        self.senders = SENDERS
        # An attempt's claim outlasts anything it can take (its time, the watchdog's tick, the lookup).
        self.lease = timedelta(seconds=self.settings["timeout"] + 30)
        # Sender slots each workspace and each destination holds (attempts under way), and the
        # destinations of the webhooks claims have seen, so that a full destination's webhooks are
        # left out of the next claim's read.
        self.holding: collections.Counter = collections.Counter()
        self.destinations: dict[int, tuple] = {}
        self.quick: set[tuple] = set()   # destinations whose last answer came within QUICK_ANSWER
        self.poll = POLL_SECONDS
        self.stopping = threading.Event()
        self.slot_freed = threading.Event()
        self.in_flight = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None

    # -- running in the background

    def start(self) -> "Deliverer":
        self.pool = ThreadPoolExecutor(self.senders, thread_name_prefix="leadsvc-send")
        self.thread = threading.Thread(target=self.run, name="leadsvc-delivery", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop claiming, and let the attempts under way finish."""
        self.stopping.set()
        self.slot_freed.set()
        events.work_waiting.set()
        if self.thread is not None:
            self.thread.join(timeout)
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.sender.close()

    def run(self) -> None:
        """Claim and hand out work until stopped: at once after a commit in this process wrote
        deliveries, else every poll interval (deliveries written by other processes)."""
        while not self.stopping.is_set():
            with self.lock:
                free = self.senders - self.in_flight
            if free <= 0:
                self.slot_freed.wait(self.poll)
                self.slot_freed.clear()
                continue
            events.work_waiting.clear()
            claimed = self._claim_safely(free)
            for item in claimed:
                with self.lock:
                    self.in_flight += 1
                    self.holding.update(item.holds)
                self.pool.submit(self._attempt_in_slot, item)
            if len(claimed) < free:
                events.work_waiting.wait(self.poll)

    def _attempt_in_slot(self, item: Claimed) -> None:
        try:
            self.attempt(item)
        except Exception:   # the claim lapses and the delivery is tried again; the thread lives on
            log.exception("delivery %s: recording the attempt failed", item.delivery.public_id)
        finally:
            release_connection()
            with self.lock:
                self.in_flight -= 1
                self.holding.subtract(item.holds)
                self.holding += collections.Counter()   # drops what no attempt holds any more
            self.slot_freed.set()
            # A claim that the caps held back (one workspace's backlog) may take its next due
            # delivery now, not a poll interval later.
            events.work_waiting.set()

    def _claim_safely(self, limit: int) -> list[Claimed]:
        try:
            return self.claim(limit)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("cannot claim deliveries: %s", exc)
        except Exception:   # the thread lives on: the next poll tries again
            log.exception("claiming deliveries failed")
        finally:
            release_connection()
        return []

    # -- one step at a time (also what tests drive, with their own clock)

    def deliver_due(self) -> int:
        """Send every delivery due now, in this thread; how many attempts were made."""
        made = 0
        while claimed := self.claim(self.senders):
            for item in claimed:
                self.attempt(item)
            made += len(claimed)
        return made

    def claim(self, limit: int) -> list[Claimed]:
        """Up to `limit` due deliveries, each leased to this process for one attempt: oldest first,
        but none of a workspace or destination that holds its share of the sender slots; then
        slots to spare, past the caps, to destinations that answer quickly."""
        now = self.clock()
        lease_until = now + self.lease
        with self.lock:
            holding = collections.Counter(self.holding)
            quick = set(self.quick)
        per_workspace, per_host = self.settings["per_workspace"], self.settings["per_host"]
        full_workspaces = [key[1] for key, held in holding.items() if key[0] == "workspace" and held >= per_workspace]
        full_hooks = [hook for hook, where in self.destinations.items() if holding[where] >= per_host]
        due = self.due(now, limit * CANDIDATES_PER_SENDER,
                       Webhook.workspace.not_in(full_workspaces) & Webhook.id.not_in(full_hooks))
        with transaction():
            candidates = list(due.tuples())
            self.learn(candidates)
            chosen = share_out(candidates, self.destinations, holding, limit, per_workspace, per_host)
            spare = limit - len(chosen) - per_workspace   # one workspace's share stays free for whoever comes next
            if spare > 0 and quick:
                others = list(self.due(now, spare * CANDIDATES_PER_SENDER, Delivery.id.not_in(list(chosen))).tuples())
                self.learn(others)
                lent = [(delivery_id, (("workspace", workspace), self.destinations[hook]))
                        for delivery_id, hook, workspace, _ in others if self.destinations[hook] in quick]
                chosen.update(lent[:spare])
            leased = list(Delivery.update(next_attempt_at=lease_until, attempts=Delivery.attempts + 1)
                          .where(Delivery.id.in_(list(chosen)) & (Delivery.next_attempt_at <= now))
                          .returning(Delivery.id, Delivery.attempts).tuples().execute()) if chosen else []
        if not leased:
            return []
        attempts = dict(leased)
        rows = (Delivery.select(Delivery, Event, Webhook).join(Event).switch(Delivery).join(Webhook)
                .where(Delivery.id.in_(list(attempts))))
        return [Claimed(row, attempts[row.id], lease_until, chosen[row.id]) for row in rows]

    def due(self, now: datetime, rows: int, which: Any):
        """The oldest `rows` due deliveries that `which` admits (PostgreSQL: skipping those another
        process is claiming)."""
        query = (Delivery.select(Delivery.id, Webhook.id, Webhook.workspace, Webhook.url).join(Webhook)
                 .where((Delivery.next_attempt_at <= now) & which).order_by(Delivery.next_attempt_at).limit(rows))
        return query.for_update(of=Delivery, skip_locked=True) if is_postgres() else query

    def learn(self, candidates: list[tuple]) -> None:
        """The destinations of the webhooks these due deliveries go to."""
        if len(self.destinations) > 100_000:   # webhooks come and go: forget, and learn again
            self.destinations.clear()
            with self.lock:
                self.quick.clear()
        self.destinations.update((hook, destination(url)) for _, hook, _, url in candidates)

    def attempt(self, item: Claimed) -> None:
        """Send one attempt and record what came of it."""
        hook, event = item.delivery.webhook, item.delivery.event
        now = self.clock()
        try:
            signing = events.signing_secrets(hook, self.settings["secret_key"], now)
        except events.SecretKeyMissing as exc:
            answer = Answer(error=str(exc))
        else:
            headers = {**events.signed_headers(event.public_id, event.body, signing, now),
                       "Content-Type": "application/json", "User-Agent": self.user_agent}
            answer = self.sender.post(hook.url, event.body.encode(), headers)
        self.note_answer_time(item.holds, answer)
        self.record(item, answer)

    def note_answer_time(self, holds: tuple, answer: Answer) -> None:
        """Whether the attempt's destination may borrow spare slots: it answered within QUICK_ANSWER."""
        if not holds:
            return
        where = holds[1]
        with self.lock:
            if answer.status is not None and answer.duration_ms <= QUICK_ANSWER * 1000:
                self.quick.add(where)
            else:
                self.quick.discard(where)

    def record(self, item: Claimed, answer: Answer) -> str | None:
        """The attempt's outcome, in its own transaction; None if the delivery moved on meanwhile
        (replayed, given up with its webhook, or deleted with it)."""
        now = self.clock()
        ok = answer.status is not None and 200 <= answer.status < 300
        disabled = None
        with transaction():
            # The webhook before its delivery, in the order every webhook write locks them (lock_webhook).
            hook = for_update(Webhook.select().where(Webhook.id == item.delivery.webhook_id), NO_KEY_UPDATE).first()
            delivery = None if hook is None else for_update(Delivery.select().where(
                (Delivery.id == item.delivery.id) & (Delivery.attempts == item.attempt)
                & (Delivery.next_attempt_at == item.lease_until))).first()
            if delivery is None:
                return None
            delivery.last_status, delivery.last_error = answer.status, answer.error
            # An erasure that cut the event while this attempt ran cleared the log: the answer
            # to the body sent before it may echo the person's data, so it is not kept.
            sent = item.delivery.event
            cut = answer.body and Event.select().where((Event.id == sent.id) & (Event.body != sent.body)).exists()
            delivery.last_response = None if cut else answer.body
            delivery.last_attempt_at, delivery.duration_ms = now, answer.duration_ms
            if not hook.active and not ok:   # disabled while this attempt ran: nothing more is scheduled
                delivery.state, delivery.next_attempt_at = "dead", None
            elif ok:
                delivery.state, delivery.next_attempt_at = "succeeded", None
                if hook.failing_since is not None:
                    Webhook.update(failing_since=None).where(Webhook.id == hook.id).execute()
            elif answer.status == 410:
                delivery.state, delivery.next_attempt_at = "dead", None
                disabled = disable(hook, "The endpoint answered 410 Gone.")
            else:
                delivery.failures += 1
                delay = next_delay(delivery.failures, answer, self.rng)
                if delay is None:
                    delivery.state, delivery.next_attempt_at = "dead", None
                else:
                    delivery.state, delivery.next_attempt_at = "failed", now + timedelta(seconds=delay)
                failing_since = hook.failing_since or now
                if hook.failing_since is None:
                    Webhook.update(failing_since=now).where(Webhook.id == hook.id).execute()
                if now - failing_since >= DISABLE_AFTER:
                    delivery.state, delivery.next_attempt_at = "dead", None
                    disabled = disable(hook, f"Every delivery failed for 3 days, since {failing_since:%Y-%m-%d %H:%M} "
                                             f"UTC (last: {describe(answer)}).")
            delivery.save()
        if not ok:
            warn_failed(item, answer, delivery.state, disabled)
        if self.metrics is not None:
            lag = (utcnow() - item.delivery.event.created_at).total_seconds() if ok else None
            self.metrics.delivery(delivery.state, lag)
        return delivery.state


def share_out(candidates: list[tuple], destinations: dict[int, tuple], holding: collections.Counter, limit: int,
              per_workspace: int, per_host: int) -> dict[int, tuple]:
    """The candidates (delivery, webhook, workspace, url; oldest first) to claim, each with the
    slots it holds: within each workspace's and destination's cap, and the workspaces with the
    fewest attempts under way first, so that a busy workspace's backlog does not come first."""
    counts = collections.Counter(holding)
    chosen: dict[int, tuple] = {}
    for level in range(per_workspace):
        for delivery_id, hook, workspace, _ in candidates:
            holds = (("workspace", workspace), destinations[hook])
            if (len(chosen) < limit and delivery_id not in chosen and counts[holds[0]] <= level
                    and counts[holds[0]] < per_workspace and counts[holds[1]] < per_host):
                chosen[delivery_id] = holds
                counts.update(holds)
    return chosen


def describe(answer: Answer) -> str:
    return f"HTTP {answer.status}" if answer.status is not None else (answer.error or "no answer")


def warn_failed(item: Claimed, answer: Answer, state: str, disabled: str | None) -> None:
    """A failed attempt in the log, so that an operator sees receivers refusing deliveries (a
    wrong secret, an endpoint gone): ids, the attempt and what came back, nothing about the lead."""
    hook, event = item.delivery.webhook.public_id, item.delivery.event.public_id
    log.warning("webhook %s: event %s, attempt %d failed: %s", hook, event, item.attempt, describe(answer))
    if disabled is not None:
        log.warning("webhook %s disabled: %s", hook, disabled)
    if state == "dead":
        log.warning("webhook %s: event %s given up after attempt %d", hook, event, item.attempt)


def disable(hook: Webhook, reason: str) -> str:
    """Turn a webhook off with a reason; its scheduled deliveries become dead (in the caller's
    transaction). The reason as kept."""
    reason = reason[:500]
    Webhook.update(active=False, disabled_reason=reason).where(Webhook.id == hook.id).execute()
    give_up(hook.id)
    return reason


def give_up(hook_id: int) -> None:
    """The webhook's scheduled deliveries become dead (it was disabled)."""
    Delivery.update(state="dead", next_attempt_at=None).where(
        (Delivery.webhook == hook_id) & Delivery.next_attempt_at.is_null(False)).execute()


def release_connection() -> None:
    """A delivery thread's PostgreSQL connection goes back to the pool between steps, so the
    delivery threads never hold connections the serving threads need. SQLite keeps its own."""
    if is_postgres() and not database.is_closed():
        database.close()
