"""Speed to lead and stale leads (DESIGN section 18): the rules, without the clock.

- A new lead gets `response_due_at`: its creation plus the first-response minutes (its source's,
  else the workspace's [sla]) of working time (working_hours.py); none without an SLA. A lead
  keeps the due time it got when the hours or the minutes change later.
- Its first response is the earliest contact activity logged on it (a completed contact task
  logs one) or its first move out of the first status: `first_response_at` holds the earliest
  seen, so a contact logged later with an earlier `occurred_at` moves it back, and
  `first_response_seconds` is counted in working time from creation.
- A lead in an open status with `stale_after_days` goes stale that many days after it was last
  touched (moved, or a contact logged): `stale_since`.
- The `sla` object of a lead document and `filter[sla]` read its state by one rule, here.

lead_timers.py writes these columns on a lead's changes and arms the clock's timers for them.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timedelta
from typing import Iterable

import peewee as pw

from .db import is_postgres
from .models import NEVER, Lead, Workspace
from .working_hours import WorkingHours

SLA_STATES = ("due", "overdue", "met", "missed")


@functools.lru_cache(maxsize=256)
def _hours(setting: str | None, timezone: str) -> WorkingHours:
    return WorkingHours.of(json.loads(setting) if setting else None, timezone)


def working_hours(workspace: Workspace) -> WorkingHours:
    """The workspace's working hours (parsed once per setting and time zone)."""
    setting = workspace.working_hours
    return _hours(json.dumps(setting, sort_keys=True) if setting else None, workspace.timezone)


def response_minutes(workspace_minutes: int | None, source_minutes: int | None) -> int | None:
    """A new lead's first-response minutes: its source's own, else the workspace's [sla]; None
    for a workspace without [sla], whatever its sources say (their minutes replace the workspace's)."""
    if workspace_minutes is None:
        return None
    return workspace_minutes if source_minutes is None else source_minutes


def response_due_at(workspace: Workspace, created_at: datetime, minutes: int | None) -> datetime | None:
    """When a lead created at `created_at` must have its first response: `minutes` of working time later."""
    return None if minutes is None else working_hours(workspace).add(created_at, minutes * 60)


def response_seconds(workspace: Workspace, created_at: datetime, responded_at: datetime) -> int:
    """Working seconds from a lead's creation to its first response (0 for a response dated before it)."""
    return working_hours(workspace).between(created_at, responded_at)


def stale_since(status_changed_at: datetime, last_activity_at: datetime | None, days: int | None) -> datetime | None:
    """When a lead goes stale: its last move or contact plus its status's stale_after_days; None
    for a status without it (won and lost statuses never have it)."""
    if days is None:
        return None
    return max(status_changed_at, last_activity_at or NEVER) + timedelta(days=days)


def stale_since_sql(days: int) -> pw.Node:
    """stale_since() in SQL, for an UPDATE of many leads: the later of the last move and the last
    contact, plus `days`."""
    last_contact = pw.fn.COALESCE(Lead.last_activity_at, Lead.status_changed_at)
    if is_postgres():
        return pw.fn.GREATEST(Lead.status_changed_at, last_contact) + pw.SQL("make_interval(days => %s)", (days,))
    # Whole days leave the fraction of a second as it was: the date and time moved, then the
    # stored fraction (".ffffff", or none), so the value is to the microsecond and in the format
    # every datetime column holds, and compares as the same time written from Python would.
    last_touch = pw.fn.MAX(Lead.status_changed_at, last_contact)
    return pw.fn.strftime("%Y-%m-%d %H:%M:%S", last_touch, f"+{days} days").concat(pw.fn.substr(last_touch, 20))


def state(due: datetime | None, responded: datetime | None, now: datetime) -> str | None:
    """due (no response, not yet due), overdue (no response, past due), met or missed (responded
    by due_at or after); None without a due time."""
    if due is None:
        return None
    if responded is None:
        return "overdue" if now >= due else "due"
    return "met" if responded <= due else "missed"


def condition(states: list[str], now: datetime) -> pw.Expression:
    """filter[sla]: leads in any of the states, by state()'s rule in SQL."""
    unanswered, answered = Lead.first_response_at.is_null(), Lead.first_response_at.is_null(False)
    conditions = {
        "due": unanswered & (Lead.response_due_at > now),
        "overdue": unanswered & (Lead.response_due_at <= now),
        "met": answered & (Lead.first_response_at <= Lead.response_due_at),
        "missed": answered & (Lead.first_response_at > Lead.response_due_at),
    }
    return functools.reduce(lambda a, b: a | b, (conditions[wanted] for wanted in states))


def stale_condition(stale: bool, now: datetime, stale_after_days: Iterable[int | None]) -> pw.Expression:
    """filter[stale]: true, leads whose stale_since has passed; false, every other lead (null included).

    `stale_after_days` are the workspace's statuses' settings. A lead goes stale no sooner than the
    shortest of them after its creation (stale_since counts from a move or contact, never before
    the lead existed), so `true` also bounds created_at: the newest leads, which cannot be stale
    yet, are skipped as a range of the created_at index instead of read one by one."""
    if not stale:
        return Lead.stale_since.is_null() | (Lead.stale_since > now)
    shortest = min(filter(None, stale_after_days), default=None)
    if shortest is None:   # no status has the setting, so no lead has a stale_since
        return Lead.id.in_([])
    return (Lead.stale_since <= now) & (Lead.created_at <= now - timedelta(days=shortest))
