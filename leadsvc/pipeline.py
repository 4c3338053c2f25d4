"""Create, update and move leads, and add notes and activities: one transaction each, with audit
entry, timeline and event in it (a batch is single creates, each in its own).

The API, web forms and CSV import all come through here, so validation against the workspace's
definitions, duplicate detection, routing and scoring happen the same way for every lead, and an
item that fails is answered the same way (item_failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

import marshmallow as ma
import peewee as pw

from . import events, followups, lead_timers, routing, search
from .auth import survivor_of
from .conditional import check_if_match, lock_lead
from .consent import consent_again, new_consent
from .custom_fields import check_custom_fields
from .db import any_of, for_update, insert_rows, transaction
from .documents import ActorNames, activity_document, member_ref, note_document, status_ref, transition_document
from .extensions import check_storable
from .history import Actor, activity_row, plain, record_activity, record_audit
from .models import (ATTRIBUTION_KEYS, CONTACT_KINDS, Activity, Lead, LostReason, Member, Note, Status, Transition,
                     utcnow)
from .problems import Conflict, Forbidden, NotFound, Problem, ValidationFailed, flatten_messages
from .refs import Refs
from .schemas import LeadCreateSchema, missing_contact
from .scoring import ENGAGEMENT_POINTS, score_lead

# What cannot be logged on a do-not-contact lead: reaching out to the person (a meeting they ask for can be).
OUTREACH_KINDS = frozenset({"call", "email", "whatsapp", "sms"})


@dataclass
class Created:
    lead: Lead
    duplicate: bool
    matched_on: list[str] = field(default_factory=list)
    updated_fields: list[str] | None = None   # an upsert's changed fields, as PATCH names them


@dataclass
class Updated:
    lead: Lead
    changed: list[str]   # PATCH names: first_name, custom_fields.budget, ...


# --- validation against the workspace's definitions ------------------------------------------

def resolve_source(public_id: str | None, refs: Refs):
    if public_id is None:
        return None
    source = refs.by_public_id(refs.sources, public_id)
    if source is None:
        raise ValidationFailed.field("source", "Unknown source; GET /api/v1/sources lists them.")
    return source


# --- scoring ---------------------------------------------------------------------------------

def rescore(lead: Lead, refs: Refs) -> None:
    """Store the lead's score and reasons from its current fields, status and engagement."""
    source = refs.sources.get(lead.source_id)
    lead.score, lead.score_reasons = score_lead(
        phone=lead.phone, email=lead.email, first_name=lead.first_name, last_name=lead.last_name,
        estimated_value=lead.estimated_value, custom_fields=lead.custom_fields or {},
        source=(source.name, source.score) if source else None,
        field_scores={name: f.score for name, f in refs.custom_fields.items() if f.score},
        engagement=lead.engagement, status_kind=refs.statuses[lead.status_id].kind,
    )


# --- create ----------------------------------------------------------------------------------

CREATE_FIELDS = ("first_name", "last_name", "phone", "email", "source", "estimated_value", "custom_fields")


def first_touch(sent: Mapping[str, str] | None) -> tuple[dict[str, str] | None, str | None]:
    """A new lead's attribution (the keys given, in models.ATTRIBUTION_KEYS order; None without
    any) and its campaign: the campaign id, else the UTM campaign, what the conversion report
    groups by."""
    attribution = {key: sent[key] for key in ATTRIBUTION_KEYS if (sent or {}).get(key)}
    if not attribution:
        return None, None
    return attribution, attribution.get("campaign_id") or attribution.get("utm_campaign")


def leads_with_contact(workspace_id: int, phone: str | None, email: str | None) -> pw.ModelSelect | None:
    """The ids, phones and e-mails of the workspace's leads with this phone or this e-mail (None:
    neither given). Only those columns: a create that finds none needs nothing more."""
    contact = [column == value for column, value in ((Lead.phone, phone), (Lead.email, email)) if value]
    if not contact:
        return None
    return Lead.select(Lead.id, Lead.phone, Lead.email).where((Lead.workspace == workspace_id) & any_of(contact))


def find_duplicate(workspace_id: int, phone: str | None, email: str | None) -> tuple[Lead | None, list[str]]:
    """The existing lead with this phone (first) or e-mail, and which of the two it matched on,
    locked until the transaction ends (in the caller's transaction); for a merged lead's contact,
    its survivor.

    The lock keeps an erasure (or a change of contact) out until the duplicate's history is
    written, so that an erasure scrubs it; PostgreSQL checks a row it waited for against the
    condition again, so a lead erased meanwhile (its contact null) is no match. In id order, so
    that two creates matching the same leads lock them in the same order."""
    query = leads_with_contact(workspace_id, phone, email)
    candidates = [] if query is None else list(for_update(query.order_by(Lead.id)).tuples())
    if not candidates:
        return None, []
    lead_id, lead_phone, lead_email = next((c for c in candidates if phone and c[1] == phone), candidates[0])
    matched = [name for name, value, theirs in (("phone", phone, lead_phone), ("email", email, lead_email))
               if value and theirs == value]
    # A merged lead keeps its phone and e-mail (merge.py): they match its survivor, locked too.
    return survivor_of(Lead.get_by_id(lead_id), for_update), matched


def create_lead(data: Mapping[str, Any], actor: Actor, refs: Refs) -> Created:
    """Create a lead (or report the duplicate it matches, and update it as data["on_duplicate"]
    says): validated, routed, scored and audited."""
    source = resolve_source(data.get("source"), refs)
    custom = check_custom_fields(data.get("custom_fields") or {}, refs.custom_fields)
    if not refs.statuses:
        raise Conflict("The workspace has no pipeline statuses yet; run leadsvc setup.")
    phone, email = data.get("phone"), data.get("email")
    now = utcnow()
    status = refs.first_status()
    attribution, campaign = first_touch(data.get("attribution"))
    lead = Lead(workspace=actor.workspace.id, first_name=data.get("first_name") or "",
                last_name=data.get("last_name") or "", phone=phone, phone_reversed=search.phone_reversed(phone),
                name_key=search.name_key(data.get("first_name") or "", data.get("last_name") or ""),
                email=email, source=source,
                status=status, estimated_value=data.get("estimated_value"), custom_fields=custom,
                do_not_contact=bool(data.get("do_not_contact")), created_at=now, updated_at=now,
                status_changed_at=now, channel=actor.channel, connector=actor.connector, attribution=attribution,
                campaign=campaign)
    lead_timers.start(lead, refs)
    consent = new_consent(lead, data.get("consent"), actor, now)
    rescore(lead, refs)
    routed = {**data, "source": source.public_id if source else None, "custom_fields": custom}
    try:
        with transaction(turn=actor.workspace.id):
            # On SQLite the write lock keeps every other create out from here on; on PostgreSQL
            # the unique indexes catch a create that commits in between (below).
            existing, matched_on = find_duplicate(actor.workspace.id, phone, email)
            if existing is not None:
                return _duplicate(existing, matched_on, data, actor, refs)
            assignment = routing.route(refs.workspace, routed, refs.members, refs.rules)
            lead.owner, lead.team = assignment.member, assignment.team_id
            lead.save(force_insert=True)
            lead_timers.arm_new(lead)
            if consent is not None:
                consent.lead = lead
                consent.save(force_insert=True)
            search.save_name_parts([lead])
            _record_creation(lead, assignment, actor)
            events.record(refs, "lead.created", lead, lambda: _routing_details(assignment))
            if assignment.member is None:
                events.record(refs, "lead.unassigned", lead, lambda: _routing_details(assignment))
    except pw.IntegrityError:
        # PostgreSQL: a create that committed after this one began took the phone or e-mail.
        with transaction():
            existing, matched_on = find_duplicate(actor.workspace.id, phone, email)
            if existing is None:
                raise
            return _duplicate(existing, matched_on, data, actor, refs)
    return Created(lead, duplicate=False)


def _routing_details(assignment: routing.Assignment) -> dict[str, Any]:
    """How a new lead was routed, as lead.created and lead.unassigned carry it."""
    return {"routing": {"owner": member_ref(assignment.member), "summary": assignment.summary, **assignment.reason}}


def _record_creation(lead: Lead, assignment: routing.Assignment, actor: Actor) -> None:
    """A new lead's history: its first transition, the created and assigned activities and the audit entry."""
    recorded = {name: plain(getattr(lead, name)) for name in
                ("first_name", "last_name", "phone", "email", "source", "estimated_value", "custom_fields", "status",
                 "owner", "channel", "connector", "attribution")}
    insert_rows(Transition, [{"workspace": lead.workspace_id, "lead": lead.id, "from_status": None,
                              "to_status": lead.status_id, "at": lead.created_at, **actor.columns()}])
    insert_rows(Activity, [
        activity_row(lead, actor, "created", "Lead created.", {"via": lead.channel}),
        activity_row(lead, actor, "assigned", assignment.summary, assignment.reason),
    ])
    if lead.consent is not None:
        recorded["consent"] = lead.consent["id"]
    if lead.do_not_contact:   # a sender said so (JustDial's dncmobile)
        recorded["do_not_contact"] = True
    record_audit(lead, actor, "created", {name: {"old": None, "new": value} for name, value in recorded.items()
                                          if value not in (None, "", {})})


def _duplicate(lead: Lead, matched_on: list[str], data: Mapping[str, Any], actor: Actor, refs: Refs) -> Created:
    """Record the submission on the lead it duplicates and, for an upsert, update that lead as a
    PATCH of the fields sent would (in the caller's transaction)."""
    if not actor.sees(lead):
        raise Conflict(f"A lead with this {' and '.join(matched_on)} already exists and is outside your scope.")
    on_duplicate = data.get("on_duplicate") or "ignore"
    if on_duplicate != "ignore":
        actor.require("leads:update", f"A lead with this {' and '.join(matched_on)} exists; on_duplicate="
                                      f"{on_duplicate} needs the leads:update ability. Nothing was changed.")
    # The lead keeps its own attribution (first touch); the one sent is recorded with the rest.
    sent = {name: plain(data[name]) for name in (*CREATE_FIELDS, "attribution") if data.get(name) not in (None, "", {})}
    record_activity(lead, actor, "duplicate_submission", f"The same {' and '.join(matched_on)} was submitted again.",
                    {"matched_on": matched_on, "submitted": sent, **({"on_duplicate": on_duplicate}
                                                                     if on_duplicate != "ignore" else {})})
    events.record(refs, "lead.duplicate_submitted", lead, lambda: {"matched_on": matched_on, "submitted": sent})
    if data.get("consent"):
        lead = consent_again(lead, data["consent"], actor, refs)
    if on_duplicate == "ignore":
        return Created(lead, duplicate=True, matched_on=matched_on)
    updated = update_lead(lead, {name: data[name] for name in CREATE_FIELDS if name in data}, actor, refs,
                          only_empty=on_duplicate == "fill_empty")
    return Created(updated.lead, duplicate=True, matched_on=matched_on, updated_fields=updated.changed)


# --- batches: each item on its own ----------------------------------------------------------

def item_failure(exc: ma.ValidationError | Problem, whole: str) -> tuple[int, dict[str, list[str]]]:
    """What one item that failed (a batch item, a CSV row, a form submission) is answered: its
    status and its messages by field, `whole` naming the field of a message about the whole item."""
    if isinstance(exc, ma.ValidationError):
        return 422, flatten_messages(exc.messages)
    return exc.status, exc.errors or {whole: [exc.detail or exc.code]}


def create_batch(items: Sequence[Any], actor: Actor, refs: Refs,
                 answer: Callable[[Created], dict[str, Any]]) -> dict[str, Any]:
    """Create each item as a single create would, in its own transaction, so that an item that
    fails fails alone: one result per item, in the order sent, and the counts (LeadBatchResultSchema).
    `answer` is the body POST /api/v1/leads answers for a created item."""
    schema = LeadCreateSchema()
    results, meta = [], {"created": 0, "duplicates": 0, "failed": 0}
    for index, item in enumerate(items):
        result = {"index": index, "status": 422, "duplicate": False, "lead": None, "errors": None}
        try:
            check_storable(item)
            created = create_lead(schema.load(item), actor, refs)
            body = answer(created)
        except (ma.ValidationError, Problem) as exc:
            if isinstance(exc, Problem) and exc.status >= 500:   # the database, not the item: the request fails
                raise
            result["status"], result["errors"] = item_failure(exc, "body")
        else:
            result.update(status=200 if created.duplicate else 201, duplicate=created.duplicate, lead=body["data"])
            result.update({key: body[key] for key in ("matched_on", "updated_fields") if key in body})
        meta["duplicates" if result["status"] == 200 else "created" if result["status"] == 201 else "failed"] += 1
        results.append(result)
    return {"data": results, "meta": meta}


# --- update ----------------------------------------------------------------------------------

def update_lead(lead: Lead, changes: Mapping[str, Any], actor: Actor, refs: Refs, *,
                if_match: str | None = None, only_empty: bool = False,
                routed: routing.Assignment | None = None) -> Updated:
    """Apply the fields sent; one audit entry with old and new values, none if nothing changed.

    only_empty (an upsert's fill_empty): only the fields the lead has empty (null or "") take the
    value sent, custom fields key by key, judged on the locked row. routed: the distribution
    rules chose the owner sent (route_again), and the `assigned` activity says so."""
    wanted: dict[str, Any] = {}
    for name in ("first_name", "last_name"):
        if name in changes:
            wanted[name] = changes[name] or ""
    for name in ("phone", "email", "estimated_value", "do_not_contact"):
        if name in changes:
            wanted[name] = changes[name]
    if "source" in changes:
        wanted["source"] = resolve_source(changes["source"], refs)
    if "owner" in changes:
        wanted["owner"] = assignable_member(changes["owner"], actor)
    custom = check_custom_fields(changes.get("custom_fields") or {}, refs.custom_fields, allow_null=True)

    with transaction():
        current = lock_lead(lead, actor)
        check_if_match(current, if_match)
        if only_empty:
            wanted = {name: new for name, new in wanted.items() if _stored(current, name) in EMPTY}
            custom = {key: new for key, new in custom.items() if (current.custom_fields or {}).get(key) in EMPTY}
        diff: dict[str, dict[str, Any]] = {}
        owner_before = current.owner_id
        for name, new in wanted.items():
            old = getattr(current, name)
            if _raw(old) != _raw(new):
                diff[name] = {"old": plain(old), "new": plain(new)}
                setattr(current, name, new)
        merged = dict(current.custom_fields or {})
        for key, value in custom.items():
            old = merged.get(key)
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
            if old != value:
                diff[f"custom_fields.{key}"] = {"old": old, "new": value}
        if errors := missing_contact(current.phone, current.email):
            raise ValidationFailed(errors=errors)
        if not diff:
            return Updated(current, [])
        _check_contact_is_free(current, diff)
        current.custom_fields = merged
        if "phone" in diff:
            current.phone_reversed = search.phone_reversed(current.phone)
        if "first_name" in diff or "last_name" in diff:
            current.name_key = search.name_key(current.first_name, current.last_name)
        if "owner" in diff:
            team_before = current.team_id
            current.team = current.owner.team_id if current.owner else None
            if current.team_id != team_before:   # the team decides a manager's scope: audit it too
                teams = {team.id: team.public_id for team in refs.teams.values()}
                diff["team"] = {"old": teams.get(team_before), "new": teams.get(current.team_id)}
        now = utcnow()
        current.updated_at, current.version = now, current.version + 1
        rescore(current, refs)
        try:
            with transaction():
                current.save()
        except pw.IntegrityError:
            raise Conflict("Another lead already has this phone number or e-mail.") from None
        if "first_name" in diff or "last_name" in diff:
            search.save_name_parts([current], replace=True)
        if "owner" in diff:
            followups.follow_owner(current, owner_before, actor, refs)
        record_activity(current, actor, "updated", "Changed " + ", ".join(sorted(diff)) + ".", {"fields": sorted(diff)})
        reason = None
        if "owner" in diff:
            owner = current.owner
            if routed is not None:
                reason, summary = routed.reason, routed.summary
            else:
                reason = {"rule": None, "strategy": "manual", "member": owner.public_id if owner else None}
                summary = f"Assigned to {owner.name if owner else 'nobody'} by hand."
            record_activity(current, actor, "assigned", summary, reason)
        record_audit(current, actor, "updated", diff)
        # The team follows the owner: it is in the lead, not a field a PATCH names.
        events.record(refs, "lead.updated", current,
                      lambda: {"changes": {name: change for name, change in diff.items() if name != "team"}})
        if reason is not None:
            events.record(refs, "lead.assigned", current, lambda: {
                "from": member_ref(refs.by_public_id(refs.members, diff["owner"]["old"])), "to": member_ref(current.owner),
                "reason": reason})
    return Updated(current, sorted(diff))


def route_again(lead: Lead, actor: Actor, refs: Refs) -> Updated:
    """Give the lead to the member the distribution rules choose now (as for a new lead with its
    fields), recorded as a PATCH of its owner is but with the rules' reason: a deactivated
    member's leads, a bulk assignment by routing."""
    source = refs.sources.get(lead.source_id)
    fields = {"source": source.public_id if source else None, "estimated_value": lead.estimated_value,
              "custom_fields": lead.custom_fields or {}}
    with transaction():   # the rotation state the rules read stays locked until the lead is written
        assignment = routing.route(refs.workspace, fields, refs.members, refs.rules)
        owner = assignment.member.public_id if assignment.member else None
        return update_lead(lead, {"owner": owner}, actor, refs, routed=assignment)


EMPTY = (None, "")   # what fill_empty fills


def _stored(lead: Lead, name: str) -> Any:
    """A field's stored value; a foreign key's id, without loading the row it names."""
    field = getattr(Lead, name)
    return getattr(lead, field.object_id_name if isinstance(field, pw.ForeignKeyField) else name)


def _raw(value: Any) -> Any:
    return value.id if isinstance(value, pw.Model) else value


def assignable_member(public_id: str | None, actor: Actor, field: str = "owner") -> Member | None:
    """The member a lead may be handed to by this actor (None: unassigned), else 422 on `field`."""
    if public_id is None:
        return None
    query = Member.select().where((Member.public_id == public_id) & (Member.workspace == actor.workspace.id))
    if actor.member_scope is not None:
        query = query.where(actor.member_scope)
    member = query.first()
    if member is None:
        raise ValidationFailed.field(field, "Unknown member, or one you cannot assign leads to.")
    if not member.active:
        raise ValidationFailed.field(field, "This member is deactivated and cannot receive leads.")
    return member


def _check_contact_is_free(lead: Lead, diff: Mapping[str, Any]) -> None:
    for name in ("phone", "email"):
        value = getattr(lead, name)
        if name in diff and value and Lead.select(Lead.id).where(
                (Lead.workspace == lead.workspace_id) & (getattr(Lead, name) == value) & (Lead.id != lead.id)).exists():
            raise Conflict(f"Another lead already has this {'phone number' if name == 'phone' else 'e-mail'}.")


# --- stage moves -----------------------------------------------------------------------------

def lost_reason_for(target: Status, reason_id: str | None, refs: Refs) -> LostReason | None:
    """The reason a move to `target` records: required for a lost status when the workspace
    defines reasons, refused for any other status."""
    if target.kind != "lost":
        if reason_id is not None:
            raise ValidationFailed.field("reason", f"Only a move to a lost status takes a reason; {target.name} is "
                                                   f"{target.kind}.")
        return None
    if reason_id is None:
        if refs.lost_reasons:
            names = ", ".join(f"{r.name} ({r.public_id})" for r in refs.lost_reasons.values())
            raise ValidationFailed.field("reason", f"Say why the lead was lost: one of {names}.")
        return None
    reason = refs.by_public_id(refs.lost_reasons, reason_id)
    if reason is None:
        raise ValidationFailed.field("reason", "Unknown lost reason; GET /api/v1/lost-reasons lists them.")
    return reason


def move_target(status_id: str, reason: str | None, refs: Refs) -> tuple[Status, LostReason | None]:
    """The status a move names and its lost reason (None unless lost), else 422 on the field."""
    target = refs.by_public_id(refs.statuses, status_id)
    if target is None:
        raise ValidationFailed.field("status", "Unknown status; GET /api/v1/statuses lists them.")
    return target, lost_reason_for(target, reason, refs)


def move_status(lead: Lead, status_id: str, note: str | None, actor: Actor, refs: Refs, *,
                if_match: str | None = None, reason: str | None = None) -> tuple[Lead, Transition]:
    """Move the lead to another status: transition, activity and audit entry in one transaction. A
    move out of the first status may be the lead's first response; every move re-dates its going stale."""
    target, lost_reason = move_target(status_id, reason, refs)
    with transaction():
        current = lock_lead(lead, actor)
        check_if_match(current, if_match)
        here = refs.statuses[current.status_id]
        allowed = here.next_ids(refs.pipeline())
        options = ", ".join(f"{s.name} ({s.public_id})" for s in refs.pipeline() if s.public_id in allowed) or "none"
        if target.id == here.id:
            raise Conflict(f"The lead is already in {here.name}. It can move to: {options}.")
        if target.public_id not in allowed:
            raise Conflict(f"A lead in {here.name} cannot move to {target.name}. It can move to: {options}.")
        now = utcnow()
        transition = Transition.create(
            workspace=current.workspace_id, lead=current, from_status=here, to_status=target, note=note,
            at=now, seconds_in_from=max(0, int((now - current.status_changed_at).total_seconds())),
            lost_reason=lost_reason, **actor.columns())
        changes = {"status": {"old": here.public_id, "new": target.public_id}}
        if current.lost_reason_id != (lost_reason.id if lost_reason else None):   # re-opening clears it
            old = refs.lost_reasons.get(current.lost_reason_id)
            changes["lost_reason"] = {"old": plain(old), "new": plain(lost_reason)}
            current.lost_reason = lost_reason
        current.status, current.status_changed_at = target, now
        if here.id == refs.first_status().id:
            lead_timers.responded(current, now, refs)
        lead_timers.touched(current, refs)
        current.updated_at, current.version = now, current.version + 1
        rescore(current, refs)
        current.save()
        summary = (f"Moved from {here.name} to {target.name}" + (f" ({lost_reason.name})." if lost_reason else ".")
                   + (f" {note}" if note else ""))
        record_activity(current, actor, "status_changed", summary,
                  {"from": here.public_id, "to": target.public_id, "transition": transition.public_id,
                   **({"lost_reason": lost_reason.public_id} if lost_reason else {})})
        record_audit(current, actor, "status_changed", changes)
        events.record(refs, "lead.status_changed", current, lambda: {
            "from": status_ref(here), "to": status_ref(target),
            "transition": transition_document(transition, ActorNames([transition], refs))})
    return current, transition


# --- timeline --------------------------------------------------------------------------------

NOTE_EXCERPT = 200   # characters of a note repeated in its timeline entry


def add_note(lead: Lead, body: str, actor: Actor, refs: Refs) -> Note:
    """Add a note: the note, its timeline entry, its audit entry and its event in one transaction."""
    with transaction():
        lead = lock_lead(lead, actor)
        note = Note.create(workspace=lead.workspace_id, lead=lead, body=body, **actor.columns())
        record_activity(lead, actor, "note", body[:NOTE_EXCERPT], {"note": note.public_id})
        record_audit(lead, actor, "note_added", {"note": {"old": None, "new": note.public_id}})
        events.record(refs, "lead.note_added", lead, lambda: {"note": note_document(note, ActorNames([note], refs))})
    return note


def edit_note(note: Note, body: str, actor: Actor, refs: Refs) -> Note:
    """Change a note's body: the note, its timeline entry's excerpt, an audit entry with the old
    and the new body and its event in one transaction (a body sent unchanged writes nothing)."""
    with transaction():
        lead, current = _lock_note(note, actor)
        old = current.body
        if body == old:
            return current
        current.body = body
        current.save()
        Activity.update(summary=body[:NOTE_EXCERPT]).where(_timeline_entry(lead, current)).execute()
        record_audit(lead, actor, "note_edited", {"note": {"old": current.public_id, "new": current.public_id},
                                                  "body": {"old": old, "new": body}})
        events.record(refs, "lead.note_edited", lead,
                      lambda: {"note": note_document(current, ActorNames([current], refs))})
    return current


def delete_note(note: Note, actor: Actor, refs: Refs) -> None:
    """Delete a note and its timeline entry; the audit entry keeps the old body (one transaction)."""
    with transaction():
        lead, current = _lock_note(note, actor)
        Activity.delete().where(_timeline_entry(lead, current)).execute()
        Note.delete().where(Note.id == current.id).execute()
        record_audit(lead, actor, "note_deleted", {"note": {"old": current.public_id, "new": None},
                                                   "body": {"old": current.body, "new": None}})
        events.record(refs, "lead.note_deleted", lead, lambda: {"note": {"id": current.public_id}})


def _lock_note(note: Note, actor: Actor) -> tuple[Lead, Note]:
    """The note's lead and the note, locked, if the actor may change it: the lead in its scope (else
    404) and not erased (409), the note still there (404), and written by the actor's member
    unless the actor is an admin (403)."""
    lead = lock_lead(note.lead, actor)
    current = for_update(Note.select().where(Note.id == note.id)).first()
    if current is None:
        raise NotFound(f"No note {note.public_id}.")
    if actor.caller is not None and actor.caller.role != "admin" and current.actor_member_id != actor.member.id:
        raise Forbidden(f"Note {note.public_id} was written by someone else: only its author or an admin may "
                        "change it.")
    return lead, current


def _timeline_entry(lead: Lead, note: Note) -> pw.Expression:
    """The `note` activity that repeats this note on the lead's timeline."""
    entries = [activity_id for activity_id, data in Activity.select(Activity.id, Activity.data).where(
        (Activity.lead == lead.id) & (Activity.kind == "note")).tuples() if (data or {}).get("note") == note.public_id]
    return Activity.id.in_(entries)


def log_activity(lead: Lead, kind: str, summary: str, occurred_at: datetime | None, actor: Actor,
                 refs: Refs, data: dict[str, Any] | None = None) -> tuple[Lead, Activity]:
    """Log a call, e-mail, meeting, visit or message: moves last_activity_at and the engagement
    score, may be the lead's first response, and puts off its going stale. `data` is the
    activity's (a completed task names itself there).

    last_activity_at only moves forward: logging an older contact after a newer one keeps the newer.
    """
    if kind not in CONTACT_KINDS:
        raise ValueError(f"not a contact kind: {kind}")
    with transaction():
        current = lock_lead(lead, actor)
        if current.do_not_contact and kind in OUTREACH_KINDS:
            raise Conflict(f"Lead {lead.public_id} is do-not-contact (its consent was withdrawn, or it was set): "
                           f"a {kind} cannot be logged on it.")
        before = {"last_activity_at": current.last_activity_at, "score": current.score}
        activity = record_activity(current, actor, kind, summary, data, at=occurred_at)
        at = activity.occurred_at
        if current.last_activity_at is None or at > current.last_activity_at:
            current.last_activity_at = current.activity_sort_at = at
        lead_timers.responded(current, at, refs)
        lead_timers.touched(current, refs)
        current.engagement += ENGAGEMENT_POINTS[kind]
        current.updated_at, current.version = utcnow(), current.version + 1
        rescore(current, refs)
        current.save()
        changes = {name: {"old": plain(old), "new": plain(getattr(current, name))}
                   for name, old in before.items() if old != getattr(current, name)}
        record_audit(current, actor, "activity_logged", {"activity": {"old": None, "new": activity.public_id}, **changes})
        events.record(refs, "lead.activity_logged", current,
                      lambda: {"activity": activity_document(activity, ActorNames([activity], refs))})
    return current, activity
