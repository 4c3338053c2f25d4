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

Where an attempt may go, and the HTTP request itself, are outbound.py's. The same machine runs
other outbound jobs kept in the database the same way (a `kind` of job: a row due at its
`next_attempt_at`, attempts that fence what is recorded): Meta's intakes waiting for their lead
from the Graph API are one (intake/fetch.py). The retry SCHEDULE, the caps and the sender pool
are shared.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable
from urllib.parse import urlsplit

import peewee as pw

from . import events
from .db import NO_KEY_UPDATE, UNAVAILABLE_ERRORS, database, for_update, is_postgres, read_rows, statement, transaction
from .models import Delivery, Event, Webhook, utcnow
from .outbound import Answer, Sender, operator_settings

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


# --- the kinds of job ------------------------------------------------------------------------

@dataclass
class Claimed:
    """A job leased for one attempt: its attempt number and lease end fence what is recorded."""

    job: Any            # the row the attempt is about (a Delivery, an Intake), as its kind loaded it
    attempt: int
    lease_until: datetime
    holds: tuple = ()   # the workspace and destination whose sender slots the attempt counts against
    kind: "Jobs | None" = None


def destination(url: str) -> tuple[str, ...]:
    """Where a URL's requests go, for the per-host cap: host and port (a URL that does not parse
    is its own destination; its attempt fails at once)."""
    try:
        parts = urlsplit(url)
        return ("host", (parts.hostname or "").lower(), str(parts.port or (443 if parts.scheme == "https" else 80)))
    except ValueError:
        return ("host", url)


class Jobs:
    """One kind of job the deliverer claims: rows due at their `next_attempt_at`, each attempt an
    outbound request. A kind says which are due, leases and loads them, makes one attempt and
    records it; the deliverer shares the sender slots out among every kind's due jobs, oldest first."""

    def __init__(self, deliverer: "Deliverer"):
        self.deliverer = deliverer

    def oldest(self, now: datetime, rows: int) -> list[tuple]:
        """Up to `rows` of the oldest due jobs, whoever holds what, as (id, workspace id,
        destination, due at), in the claim's transaction. Read on every claim: one statement,
        written once (db.statement)."""
        raise NotImplementedError

    def due(self, now: datetime, rows: int, full_workspaces: list[int], holding: collections.Counter) -> list[tuple]:
        """Up to `rows` of the oldest due jobs of the workspaces and destinations below their caps,
        as `oldest` gives them."""
        raise NotImplementedError

    def lease(self, ids: list[int], now: datetime, lease_until: datetime) -> list[tuple[int, int]]:
        """Lease these jobs (those still due) for one attempt each: (id, attempt number)."""
        raise NotImplementedError

    def load(self, ids: list[int]) -> list[Any]:
        """The leased rows, with what their attempts need."""
        raise NotImplementedError

    def attempt(self, item: Claimed) -> Answer:
        """Make one attempt's request."""
        raise NotImplementedError

    def record(self, item: Claimed, answer: Answer) -> str | None:
        """The attempt's outcome, in its own transaction, fenced by the attempt and lease; None if
        the job moved on meanwhile."""
        raise NotImplementedError

    def name(self, item: Claimed) -> str:
        """The job, for the log."""
        return item.job.public_id


KINDS: list[type[Jobs]] = []


def kind(cls: type[Jobs]) -> type[Jobs]:
    """Register a kind of job that every Deliverer claims (as clock.timer registers a timer's function)."""
    if cls not in KINDS:
        KINDS.append(cls)
    return cls


@kind
class WebhookDeliveries(Jobs):
    """Events to webhooks: signed POSTs, disabling an endpoint that fails for days (section 14)."""

    def __init__(self, deliverer: "Deliverer"):
        super().__init__(deliverer)
        # The destinations of the webhooks claims have seen, so that a full destination's webhooks
        # are left out of the next claim's read.
        self.destinations: dict[int, tuple] = {}

    def oldest(self, now, rows):
        return self.with_destinations(read_rows(DUE_COLUMNS, statement(oldest_deliveries),
                                                [Delivery.next_attempt_at.db_value(now), rows]))

    def due(self, now, rows, full_workspaces, holding):
        per_host = self.deliverer.settings["per_host"]
        full_hooks = [hook for hook, where in self.destinations.items() if holding[where] >= per_host]
        return self.with_destinations(due_deliveries().where(
            (Delivery.next_attempt_at <= now) & Webhook.workspace.not_in(full_workspaces)
            & Webhook.id.not_in(full_hooks)).limit(rows).tuples())

    def with_destinations(self, found: Any) -> list[tuple]:
        """Rows of DUE_COLUMNS as claims take them, each webhook's destination parsed once."""
        if len(self.destinations) > 100_000:   # webhooks come and go: forget, and learn again
            self.destinations.clear()
            self.deliverer.forget_quick()
        rows = []
        for delivery_id, hook, workspace, url, due in found:
            where = self.destinations.get(hook)
            if where is None:
                where = self.destinations[hook] = destination(url)
            rows.append((delivery_id, workspace, where, due))
        return rows

    def lease(self, ids, now, lease_until):
        return list(Delivery.update(next_attempt_at=lease_until, attempts=Delivery.attempts + 1)
                    .where(Delivery.id.in_(ids) & (Delivery.next_attempt_at <= now))
                    .returning(Delivery.id, Delivery.attempts).tuples().execute())

    def load(self, ids):
        return list(Delivery.select(Delivery, Event, Webhook).join(Event).switch(Delivery).join(Webhook)
                    .where(Delivery.id.in_(ids)))

    def attempt(self, item):
        hook, event = item.job.webhook, item.job.event
        deliverer = self.deliverer
        now = deliverer.clock()
        try:
            signing = events.signing_secrets(hook, deliverer.settings["secret_key"], now)
        except events.SecretKeyMissing as exc:
            return Answer(error=str(exc))
        headers = {**events.signed_headers(event.public_id, event.body, signing, now),
                   "Content-Type": "application/json", "User-Agent": deliverer.user_agent}
        return deliverer.sender.post(hook.url, event.body.encode(), headers)

    def record(self, item, answer):
        deliverer = self.deliverer
        now = deliverer.clock()
        ok = answer.status is not None and 200 <= answer.status < 300
        disabled = None
        with transaction():
            # The webhook before its delivery, in the order every webhook write locks them (lock_webhook).
            hook = for_update(Webhook.select().where(Webhook.id == item.job.webhook_id), NO_KEY_UPDATE).first()
            delivery = None if hook is None else for_update(Delivery.select().where(
                (Delivery.id == item.job.id) & (Delivery.attempts == item.attempt)
                & (Delivery.next_attempt_at == item.lease_until))).first()
            if delivery is None:
                return None
            delivery.last_status, delivery.last_error = answer.status, answer.error
            # An erasure that cut the event while this attempt ran cleared the log: the answer
            # to the body sent before it may echo the person's data, so it is not kept.
            sent = item.job.event
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
                delay = next_delay(delivery.failures, answer, deliverer.rng)
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
        if deliverer.metrics is not None:
            lag = (utcnow() - item.job.event.created_at).total_seconds() if ok else None
            deliverer.metrics.delivery(delivery.state, lag)
        return delivery.state


DUE_COLUMNS = (Delivery.id, Webhook.id, Webhook.workspace, Webhook.url, Delivery.next_attempt_at)


def due_deliveries() -> pw.Query:
    """Deliveries oldest first, with where each goes, for a claim to narrow to the due ones."""
    query = Delivery.select(*DUE_COLUMNS).join(Webhook).order_by(Delivery.next_attempt_at)
    # On PostgreSQL the rows a claim reads are locked, and another process's claim is left to it.
    return query.for_update(of=Delivery, skip_locked=True) if is_postgres() else query


def oldest_deliveries() -> pw.Query:
    """The oldest due deliveries (parameters: now, how many)."""
    return due_deliveries().where(Delivery.next_attempt_at <= datetime.min).limit(1)


# --- the deliverer ---------------------------------------------------------------------------

class Deliverer:
    """Claims due jobs of every kind (webhook deliveries, intake fetches) and attempts them on
    SENDERS threads until stopped."""

    def __init__(self, settings: dict[str, Any], *, version: str, metrics: Any = None,
                 clock: Callable[[], datetime] = utcnow, rng: Callable[[], float] = random.random):
        self.config = settings
        self.settings = settings["webhooks"]
        self.metrics = metrics
        self.clock, self.rng = clock, rng
        self.user_agent = USER_AGENT.format(version=version)
        self.sender = Sender(self.settings)
        # The services the operator configured (connectors.*), not held to the webhook URLs' rules.
        self.operator_sender = Sender(operator_settings(self.settings["timeout"]))
        self.senders = SENDERS
        # An attempt's claim outlasts anything it can take (its time, the watchdog's tick, the
        # lookup, recording what came of it).
        self.lease = timedelta(seconds=self.settings["timeout"] + 30)
        # Sender slots each workspace and each destination holds (attempts under way).
        self.holding: collections.Counter = collections.Counter()
        self.quick: set[tuple] = set()   # destinations whose last answer came within QUICK_ANSWER
        self.kinds = [each(self) for each in KINDS]
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
        self.operator_sender.close()

    def run(self) -> None:
        """Claim and hand out work until stopped: at once after a commit in this process wrote
        jobs or an attempt ended, else every poll interval (jobs written by other processes, or
        due again). A claim looks past the workspaces at their cap after such a commit, and at
        least once a poll interval."""
        looked_past_caps = 0.0
        while not self.stopping.is_set():
            with self.lock:
                free = self.senders - self.in_flight
            if free <= 0:
                self.slot_freed.wait(self.poll)
                self.slot_freed.clear()
                continue
            events.work_waiting.clear()
            past_caps = events.jobs_written.is_set() or time.monotonic() - looked_past_caps >= self.poll
            if past_caps:
                events.jobs_written.clear()
                looked_past_caps = time.monotonic()
            claimed = self._claim_safely(free, past_caps)
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
        except Exception:   # the claim lapses and the job is tried again; the thread lives on
            log.exception("%s: recording the attempt failed", item.kind.name(item))
        finally:
            release_connection()
            with self.lock:
                self.in_flight -= 1
                self.holding.subtract(item.holds)
                self.holding += collections.Counter()   # drops what no attempt holds any more
            self.slot_freed.set()
            # A claim that the caps held back (one workspace's backlog) may take its next due
            # job now, not a poll interval later.
            events.work_waiting.set()

    def _claim_safely(self, limit: int, past_caps: bool) -> list[Claimed]:
        try:
            return self.claim(limit, past_caps)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("cannot claim deliveries: %s", exc)
        except Exception:   # the thread lives on: the next poll tries again
            log.exception("claiming deliveries failed")
        finally:
            release_connection()
        return []

    # -- one step at a time (also what tests drive, with their own clock)

    def deliver_due(self) -> int:
        """Attempt every job due now, in this thread; how many attempts were made."""
        made = 0
        while claimed := self.claim(self.senders):
            for item in claimed:
                self.attempt(item)
            made += len(claimed)
        return made

    def claim(self, limit: int, past_caps: bool = True) -> list[Claimed]:
        """Up to `limit` due jobs, each leased to this process for one attempt: oldest first, within
        each workspace's and destination's share of the sender slots, the workspaces with the fewest
        attempts under way first; then slots to spare, past the caps, to destinations that answer
        quickly. The oldest due jobs may all be of workspaces or destinations at their cap: with
        `past_caps` the claim also reads the oldest jobs of the others, a read that walks past the
        capped ones' backlog (run() asks for it when jobs were written, and once a poll interval)."""
        now = self.clock()
        lease_until = now + self.lease
        with self.lock:
            holding = collections.Counter(self.holding)
            quick = set(self.quick)
        per_workspace, per_host = self.settings["per_workspace"], self.settings["per_host"]
        rows = limit * CANDIDATES_PER_SENDER
        with transaction():
            oldest = self.candidates(rows, lambda jobs: jobs.oldest(now, rows))
            candidates = oldest
            if past_caps and len(oldest) == rows:   # fewer: every due job is among them
                full = [key[1] for key, held in holding.items() if key[0] == "workspace" and held >= per_workspace]
                others = self.candidates(rows, lambda jobs: jobs.due(now, rows, full, holding))
                candidates = sorted({job[0]: job for job in oldest + others}.values(), key=lambda job: job[3])
            chosen = share_out(candidates, holding, limit, per_workspace, per_host)
            spare = limit - len(chosen) - per_workspace   # one workspace's share stays free for whoever comes next
            if spare > 0 and quick:
                lent = [(job, (("workspace", workspace), where)) for job, workspace, where, _ in oldest
                        if job not in chosen and where in quick]
                chosen.update(lent[:spare])
            attempts = {(index, job_id): attempt for index, jobs in enumerate(self.kinds)
                        if (ids := of_kind(chosen, index))
                        for job_id, attempt in jobs.lease(ids, now, lease_until)}
        return [Claimed(row, attempts[index, row.id], lease_until, chosen[index, row.id], jobs)
                for index, jobs in enumerate(self.kinds) if (ids := of_kind(attempts, index))
                for row in jobs.load(ids)]

    def candidates(self, rows: int, read: Callable[[Jobs], list[tuple]]) -> list[tuple]:
        """The oldest `rows` of what `read` finds due of every kind, as ((kind, id), workspace,
        destination, due at)."""
        found = [((index, job_id), workspace, where, due) for index, jobs in enumerate(self.kinds)
                 for job_id, workspace, where, due in read(jobs)]
        found.sort(key=lambda candidate: candidate[3])
        return found[:rows]

    def forget_quick(self) -> None:
        with self.lock:
            self.quick.clear()

    def attempt(self, item: Claimed) -> None:
        """Make one attempt and record what came of it."""
        answer = item.kind.attempt(item)
        self.note_answer_time(item.holds, answer)
        item.kind.record(item, answer)

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


def share_out(candidates: list[tuple], holding: collections.Counter, limit: int, per_workspace: int,
              per_host: int) -> dict[tuple, tuple]:
    """The candidates (job, workspace, destination, due at; oldest first) to claim, each with the
    slots it holds: within each workspace's and destination's cap, and the workspaces with the
    fewest attempts under way first, so that a busy workspace's backlog does not come first."""
    counts = collections.Counter(holding)
    chosen: dict[tuple, tuple] = {}
    for level in range(per_workspace):
        for job, workspace, where, _ in candidates:
            holds = (("workspace", workspace), where)
            if (len(chosen) < limit and job not in chosen and counts[holds[0]] <= level
                    and counts[holds[0]] < per_workspace and counts[holds[1]] < per_host):
                chosen[job] = holds
                counts.update(holds)
    return chosen


def of_kind(jobs: dict[tuple, Any], index: int) -> list[int]:
    """The ids of the kind's jobs among (kind, id) keys."""
    return [job_id for (which, job_id) in jobs if which == index]


def describe(answer: Answer) -> str:
    return f"HTTP {answer.status}" if answer.status is not None else (answer.error or "no answer")


def warn_failed(item: Claimed, answer: Answer, state: str, disabled: str | None) -> None:
    """A failed attempt in the log, so that an operator sees receivers refusing deliveries (a
    wrong secret, an endpoint gone): ids, the attempt and what came back, nothing about the lead."""
    hook, event = item.job.webhook.public_id, item.job.event.public_id
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
