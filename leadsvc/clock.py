"""The clock: "do this at that time", once, whichever and however many processes run it.

A change that makes something due later (a task's reminder, a lead's response deadline) arms a
timer in its own transaction, `arm(kind, subject, workspace_id, at)`, and a change that makes it
no longer due disarms it. Each timer kind is one function, registered with `@timer(kind)`, that
the clock calls when the time comes, inside the transaction that deletes the timer: what the
function writes (an outbox event) commits with the deletion or not at all, so a timer fires once.

A Clock runs in `leadsvc serve` (a background thread, unless clock.in_serve is false) and in
`leadsvc worker`, ticking every clock.interval seconds. A tick takes the oldest due timers in
batches, one transaction per batch (PostgreSQL: FOR UPDATE SKIP LOCKED, so processes share a
backlog; SQLite: the write lock), each timer in a savepoint of it, so that a function that raises
undoes only its own timer, which is tried again RETRY later.

A function whose work must not hold the transaction (a request to an outside service, as
IndiaMART's pull) returns a follow-up instead: the clock calls it after the batch commits, outside
any transaction, on the clock's thread, so it bounds its own time. The function arms its timer
again before returning it, so that a follow-up a process never finished runs again then.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterable, Sequence

import peewee as pw

from .db import UNAVAILABLE_ERRORS, database, is_postgres, transaction
from .delivery import release_connection
from .models import Timer, utcnow

log = logging.getLogger("leadsvc.clock")

# fire(subject, due, now, settings): the id of the row the timer is about, the time it was armed
# for, the tick's time (later than `due` after downtime or a retry), and the running settings
# (what a request would read from its app, such as the reference data's). It returns None, or a
# follow-up to call after the commit.
Handler = Callable[[int, datetime, datetime, dict], "Callable[[], None] | None"]
HANDLERS: dict[str, Handler] = {}

# Timers one transaction fires: enough that a backlog costs few commits, few enough that the
# SQLite write lock is held briefly.
BATCH = 50
# How long a timer whose function raised (or that no function of this process fires) waits
# before it is tried again: it leaves the batch to the others.
RETRY = timedelta(minutes=1)
DISARM_CHUNK = 500   # subjects per DELETE, within every database's limit on parameters

# Set after the commit of a timer armed already due, so the clock of this process fires it at
# once rather than at its next tick.
wake = threading.Event()


def timer(kind: str) -> Callable[[Handler], Handler]:
    """Register the function that fires timers of this kind: `fire(subject, due, now, settings)`, called
    in the transaction that deletes the timer. A recurring timer's function arms it again."""
    def register(handler: Handler) -> Handler:
        if HANDLERS.setdefault(kind, handler) is not handler:
            raise ValueError(f"timer kind {kind!r} already fires {HANDLERS[kind].__qualname__}")
        return handler
    return register


def arm(kind: str, subject: int, workspace_id: int, at: datetime) -> None:
    """Make the timer of (kind, subject) due at `at`, armed or not before: in the caller's
    transaction, with the change that makes it due."""
    arm_all([(kind, subject, workspace_id, at)])


def arm_all(timers: Sequence[tuple[str, int, int, datetime]]) -> None:
    """arm() for each (kind, subject, workspace_id, at), in one statement (a new lead arms two)."""
    params: list[Any] = []
    soonest = None
    for kind, subject, workspace_id, at in timers:
        if at.tzinfo is not None:
            at = at.astimezone(UTC).replace(tzinfo=None)   # every column holds naive UTC
        params += [workspace_id, kind, subject, Timer.due_at.db_value(at), Timer.fire_at.db_value(at)]
        soonest = at if soonest is None else min(soonest, at)
    if soonest is None:
        return
    database.execute_sql(_arm_sql(database.obj, len(timers)), params)
    if soonest <= utcnow():
        database.after_commit(wake.set)


def arm_from(kind: str, query: Any, workspace: Any, subject: Any, at: Any) -> None:
    """arm() for every row of a model query, in one INSERT ... SELECT: its `workspace`, `subject`
    and `at` columns (a bulk load's timers still ahead, the leads a setup change re-dates)."""
    rows = query.select(workspace, pw.Value(kind), subject, at, at)
    (Timer.insert_from(rows, [Timer.workspace, Timer.kind, Timer.subject, Timer.due_at, Timer.fire_at])
     .on_conflict(conflict_target=[Timer.kind, Timer.subject], preserve=[Timer.workspace, Timer.due_at, Timer.fire_at])
     .execute())
    database.after_commit(wake.set)


@functools.cache
def _arm_sql(db: Any, count: int) -> str:
    """The upsert of `count` timers, written once per database and count: peewee builds a query
    for every call, which costs more than the database's work for a row this small. Its
    parameters are each timer's workspace, kind, subject, due_at and fire_at, in that order."""
    fields = [Timer.workspace, Timer.kind, Timer.subject, Timer.due_at, Timer.fire_at]
    query = (Timer.insert_many([(0, "", 0, None, None)] * count, fields=fields)
             .on_conflict(conflict_target=[Timer.kind, Timer.subject],
                          preserve=[Timer.workspace, Timer.due_at, Timer.fire_at]))
    sql, params = query.sql()
    assert len(params) == len(fields) * count, "every parameter is a timer's value"
    return sql


def disarm(kind: str, subjects: int | Iterable[int]) -> None:
    """Cancel the timer of kind for a subject, or for each of a list of subjects (one not armed
    is no matter): in the caller's transaction, with the change that makes it no longer due."""
    subjects = [subjects] if isinstance(subjects, int) else list(subjects)
    for start in range(0, len(subjects), DISARM_CHUNK):
        Timer.delete().where((Timer.kind == kind)
                             & Timer.subject.in_(subjects[start:start + DISARM_CHUNK])).execute()


class Clock:
    """Fires due timers: one `tick()`, or a tick every clock.interval seconds in a thread."""

    def __init__(self, settings: dict[str, Any], *, metrics: Any = None, clock: Callable[[], datetime] = utcnow):
        self.settings = settings
        self.interval = settings["clock"]["interval"]
        self.metrics = metrics
        self.clock = clock
        self.batch = BATCH
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    # -- running in the background

    def start(self) -> "Clock":
        self.thread = threading.Thread(target=self.run, name="leadsvc-clock", daemon=True)
        self.thread.start()
        log.info("the clock runs in this process: due timers fire every %d s", self.interval)
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop ticking after the batch under way."""
        self.stopping.set()
        wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def run(self) -> None:
        """Tick every interval (at once after this process armed a timer already due) until
        stopped; a tick that fails is logged, and the next one tries again."""
        while not self.stopping.is_set():
            wake.clear()
            try:
                self.tick()
            except UNAVAILABLE_ERRORS as exc:
                log.warning("the clock cannot reach the database: %s", exc)
            except Exception:   # the thread lives on: what was due is still due at the next tick
                log.exception("a clock tick failed")
            finally:
                release_connection()
            wake.wait(self.interval)

    # -- one tick (also what tests drive, with their own time)

    def tick(self, now: datetime | None = None) -> int:
        """Fire every timer due at `now` (default: the clock's time), oldest first, a batch at a
        time until none is left; how many fired."""
        now = now or self.clock()
        fired = 0
        while not self.stopping.is_set():
            claimed, done = self.fire_batch(now)
            fired += done
            if claimed < self.batch:
                break
        return fired

    def fire_batch(self, now: datetime) -> tuple[int, int]:
        """Fire up to a batch of the oldest due timers in one transaction: how many were taken,
        and how many of those fired."""
        # Nothing due costs this one read of the start of the fire_at index, without a transaction or
        # a lock; without a parameter, so that no plan of it reads more (docs/design.md, the clock).
        soonest = Timer.select(pw.fn.MIN(Timer.fire_at)).scalar()
        if soonest is None or soonest > now:
            return 0, 0
        due = Timer.select().where(Timer.fire_at <= now).order_by(Timer.fire_at).limit(self.batch)
        if is_postgres():   # another process's batch is left to it
            due = due.for_update(skip_locked=True)
        outcomes: collections.Counter = collections.Counter()
        follow_ups: list[tuple[Timer, Callable[[], None]]] = []
        with transaction():
            taken = list(due)
            for row in taken:
                fired, follow_up = self.fire(row, now)
                outcomes[row.kind, fired] += 1
                if follow_up is not None:
                    follow_ups.append((row, follow_up))
        if self.metrics is not None:
            for (kind, fired), count in outcomes.items():
                self.metrics.timers_fired(kind, "fired" if fired else "failed", count)
        for row, follow_up in follow_ups:
            try:
                follow_up()
            except Exception:   # its timer, armed again by its function, runs it again then
                log.exception("the follow-up of timer %s of subject %d failed", row.kind, row.subject)
        return len(taken), sum(count for (_, fired), count in outcomes.items() if fired)

    def fire(self, row: Timer, now: datetime) -> tuple[bool, Callable[[], None] | None]:
        """Delete one timer and call its function, in a savepoint of the batch's transaction;
        if the function raises, undo both and try it again later. Whether it fired, and the
        follow-up it returned."""
        handler = HANDLERS.get(row.kind)
        if handler is None:   # a kind of another version of leadsvc, or of code not loaded here
            log.warning("no function fires timers of kind %r in this process; timer %d tried again later",
                        row.kind, row.id)
        else:
            try:
                with transaction():   # nested: a savepoint
                    Timer.delete().where(Timer.id == row.id).execute()
                    follow_up = handler(row.subject, row.due_at, now, self.settings)
                return True, follow_up
            except Exception:
                log.exception("timer %s of subject %d (due %s) failed; tried again later",
                              row.kind, row.subject, row.due_at.isoformat())
        Timer.update(fire_at=now + RETRY).where(Timer.id == row.id).execute()
        return False, None
