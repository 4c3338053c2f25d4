"""A lead's response due time and staleness kept on its changes, and the clock's timers that
announce them: `lead.response_overdue` at response_due_at (disarmed by the first response) and
`lead.stale` at stale_since (armed again by every move and contact). Each fires its event once.

Every function runs in the caller's transaction, on the locked lead (sla.py has the rules).
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable

from . import clock, events, sla
from .models import Lead, Timer, Workspace
from .refs import Refs, cached_refs

RESPONSE_OVERDUE, STALE = "lead.response_overdue", "lead.stale"


def start(lead: Lead, refs: Refs) -> None:
    """A new lead's response due time and stale_since, before it is saved."""
    source = refs.sources.get(lead.source_id)
    minutes = sla.response_minutes(refs.workspace.first_response_minutes,
                                   source.first_response_minutes if source is not None else None)
    lead.response_due_at = sla.response_due_at(refs.workspace, lead.created_at, minutes)
    if lead.response_due_at is not None:
        lead.response_sort_at = lead.response_due_at
    lead.stale_since = sla.stale_since(lead.status_changed_at, None, refs.statuses[lead.status_id].stale_after_days)


def arm_new(lead: Lead) -> None:
    """The timers of a lead just saved (it has its id now)."""
    clock.arm_all([(kind, lead.id, lead.workspace_id, at)
                   for kind, at in ((RESPONSE_OVERDUE, lead.response_due_at), (STALE, lead.stale_since))
                   if at is not None])


def responded(lead: Lead, at: datetime, refs: Refs) -> None:
    """A contact, or a move out of the first status, at `at`: the lead's first response if it is
    the earliest seen (set on the lead; the caller saves it)."""
    if lead.first_response_at is not None and lead.first_response_at <= at:
        return
    if lead.first_response_at is None and lead.response_due_at is not None:
        clock.disarm(RESPONSE_OVERDUE, lead.id)
    lead.first_response_at = at
    lead.first_response_seconds = sla.response_seconds(refs.workspace, lead.created_at, at)


def touched(lead: Lead, refs: Refs) -> None:
    """After a move or a logged contact (status_changed_at and last_activity_at as they now are):
    the lead's stale_since and its timer (set on the lead; the caller saves it)."""
    since = sla.stale_since(lead.status_changed_at, lead.last_activity_at,
                            refs.statuses[lead.status_id].stale_after_days)
    if since == lead.stale_since:
        return
    lead.stale_since = since
    if since is None:
        clock.disarm(STALE, lead.id)
    else:
        clock.arm(STALE, lead.id, lead.workspace_id, since)


def redate_stale(workspace_id: int, status_id: int, days: int | None) -> None:
    """Setup changed a status's stale_after_days: its leads' stale_since from their last touch,
    and their timers; those already stale by the new setting fire at the clock's next run."""
    in_status = (Lead.workspace == workspace_id) & (Lead.status == status_id)
    Timer.delete().where((Timer.kind == STALE) & Timer.subject.in_(Lead.select(Lead.id).where(in_status))).execute()
    if days is None:
        Lead.update(stale_since=None).where(in_status).execute()
        return
    Lead.update(stale_since=sla.stale_since_sql(days)).where(in_status).execute()
    clock.arm_from(STALE, Lead.select().where(in_status), Lead.workspace, Lead.id, Lead.stale_since)


def arm_ahead(workspace_id: int, now: datetime) -> None:
    """The timers of the workspace's leads whose times are still ahead, for leads written in bulk
    (the demo): as if the clock had run all along, what fell due before `now` has fired."""
    ahead = {RESPONSE_OVERDUE: (Lead.response_due_at, [Lead.first_response_at.is_null()]),
             STALE: (Lead.stale_since, [])}
    for kind, (time, unanswered) in ahead.items():
        clock.arm_from(kind, Lead.select().where(Lead.workspace == workspace_id, time > now, *unanswered),
                       Lead.workspace, Lead.id, time)


@clock.timer(RESPONSE_OVERDUE)
def response_overdue(lead_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """The lead's response due time passed without a response: lead.response_overdue."""
    _announce(RESPONSE_OVERDUE, lead_id, settings,
              lambda lead: lead.first_response_at is None and lead.response_due_at == due)


@clock.timer(STALE)
def went_stale(lead_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """The lead went stale: lead.stale."""
    _announce(STALE, lead_id, settings, lambda lead: lead.stale_since == due)


def _announce(event_type: str, lead_id: int, settings: dict, still: Callable[[Lead], bool]) -> None:
    """The event, if the lead is still there, not erased, and still as the timer was armed for."""
    lead = Lead.get_or_none(Lead.id == lead_id)
    if lead is None or lead.erased_at is not None or not still(lead):
        return
    refs = cached_refs(Workspace.get_by_id(lead.workspace_id), settings)
    events.record(refs, event_type, lead, dict)


