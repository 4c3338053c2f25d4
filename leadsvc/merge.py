"""Merging duplicate leads into one survivor, and undoing a merge (DESIGN section 21).

A merge is one transaction over the leads locked in id order (so two merges, or a merge and a
create or an update, never wait for each other in a cycle on PostgreSQL):

- the survivor takes each field by the rule (its own value unless empty, else the first non-empty
  among the duplicates in the order sent; `prefer` names the lead a field comes from);
- the history of the duplicates (activities, notes, tasks, transitions, consents, audit entries)
  moves to the survivor with one UPDATE per kind, each row keeping its time and actor, and one
  INSERT ... SELECT per kind records where each row came from (merge_move), for an undo;
- each duplicate becomes a tombstone (lead.merged_into): out of every scope (auth.lead_scope), so
  the list, search, export and reports never show it, but still holding its phone and e-mail, so
  the create path's one duplicate lookup matches them and answers with the survivor
  (pipeline.find_duplicate). A phone or e-mail the survivor takes from a duplicate is swapped: the
  survivor's own one goes to that tombstone, and every contact point of the merged leads still
  matches the survivor.

An undo puts each moved row back on its duplicate, gives the duplicates back their contact points,
and sets each field of the survivor that still holds what the merge gave it back to what it held
before (a field changed since keeps the change).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Mapping, Sequence

import marshmallow as ma
import peewee as pw
from flask.views import MethodView

from . import clock, events, followups, lead_timers, search
from .auth import caller, in_lead_scope, member_sees_lead, requires, visible_lead_or_404
from .conditional import ETAG_HEADER, etag
from .db import for_update, transaction
from .documents import LeadSchema, lead_document, prebuilt_response
from .extensions import Blueprint
from .fields import JsonBoolean, PublicId, rfc3339
from .history import Actor, actor, record_audit
from .models import (CONTACT_KINDS, NEVER, NO_TASK, Activity, AuditEntry, Consent, Lead, Member, Merge, MergeMove,
                     Note, Task, Transition, utcnow)
from .pipeline import EMPTY, rescore
from .problems import Conflict, NotFound, ValidationFailed
from .refs import Refs, request_refs

MAX_DUPLICATES = 4
UNDO_WITHIN = timedelta(days=30)
# The fields a merge chooses, besides each custom field (`custom_fields.<key>`).
FIELDS = ("first_name", "last_name", "phone", "email", "source", "estimated_value")
CUSTOM = "custom_fields."
# The history that moves to the survivor: merge_move's kind, the model, and the name of its
# count in a dry run's `moves` (audit entries move but are not counted there).
HISTORY = (("activity", Activity, "activities"), ("note", Note, "notes"), ("task", Task, "tasks"),
           ("transition", Transition, "transitions"), ("consent", Consent, "consents"),
           ("audit_entry", AuditEntry, None))


# --- the request -------------------------------------------------------------------------------

class MergeSchema(ma.Schema):
    duplicates = ma.fields.List(PublicId("ld_"), required=True, validate=ma.validate.Length(
        1, MAX_DUPLICATES, error=f"Name 1 to {MAX_DUPLICATES} leads to merge into this one."), metadata={
        "description": "The leads that go into this one, in order: a field empty on the survivor takes the first "
                       "non-empty value among them."})
    prefer = ma.fields.Dict(keys=ma.fields.String(), values=PublicId("ld_"), metadata={
        "description": "field -> the lead (the survivor or a duplicate) whose value the field takes: first_name, "
                       "last_name, phone, email, source, estimated_value, custom_fields.<key>."})
    dry_run = JsonBoolean(load_default=False, metadata={
        "description": "Answer the lead as it would be and what would move, changing nothing."})

    class Meta:
        json_schema = {"properties": {"prefer": {"propertyNames": {
            "pattern": "^(" + "|".join(FIELDS) + r"|custom_fields\.[a-z][a-z0-9_]{0,63})$"}}}}


class MergeRefSchema(ma.Schema):
    id = ma.fields.String(required=True)
    merged = ma.fields.List(ma.fields.String(), required=True)
    undone_at = ma.fields.String(allow_none=True, metadata={"format": "date-time"})


class MovesSchema(ma.Schema):
    activities = ma.fields.Integer(required=True)
    notes = ma.fields.Integer(required=True)
    tasks = ma.fields.Integer(required=True)
    transitions = ma.fields.Integer(required=True)
    consents = ma.fields.Integer(required=True)


class MergeResultSchema(ma.Schema):
    data = ma.fields.Nested(LeadSchema, required=True, metadata={"description": "The survivor (as it would be, "
                                                                                "in a dry run)."})
    merge = ma.fields.Nested(MergeRefSchema, metadata={"description": "The merge (not in a dry run)."})
    moves = ma.fields.Nested(MovesSchema, metadata={"description": "What would move (a dry run only)."})


class UndoResultSchema(ma.Schema):
    data = ma.fields.Nested(LeadSchema, required=True, metadata={"description": "The survivor as it is now."})
    merge = ma.fields.Nested(MergeRefSchema, required=True)
    restored = ma.fields.List(ma.fields.Nested(LeadSchema), required=True, metadata={
        "description": "The duplicates, leads again."})


@dataclass
class Merged:
    survivor: Lead
    merge: Merge | None = None                 # None in a dry run
    duplicates: Sequence[Lead] = ()
    moves: dict[str, int] | None = None        # a dry run's counts


def check_request(survivor_id: str, duplicates: Sequence[str], prefer: Mapping[str, str], refs: Refs) -> None:
    """422 for what is wrong with the request itself, before any lead is read."""
    errors: dict[str, list[str]] = {}
    if survivor_id in duplicates:
        errors["duplicates"] = ["The lead merged into cannot be one of its duplicates."]
    elif len(set(duplicates)) < len(duplicates):
        errors["duplicates"] = ["A lead is named twice."]
    merged = {survivor_id, *duplicates}
    for name, lead_id in prefer.items():
        if name not in FIELDS and not (name.startswith(CUSTOM) and name[len(CUSTOM):] in refs.custom_fields):
            errors[f"prefer.{name}"] = [f"Not a field a merge chooses: {', '.join(FIELDS)} or custom_fields.<key> "
                                        "of a defined custom field."]
        elif lead_id not in merged:
            errors[f"prefer.{name}"] = ["Not a lead of this merge: name the survivor or one of the duplicates."]
    if errors:
        raise ValidationFailed(errors=errors)


# --- what the survivor keeps -------------------------------------------------------------------

def _value(lead: Lead, name: str) -> Any:
    """A merged field's stored value on a lead (a foreign key's id, a custom field's value)."""
    if name.startswith(CUSTOM):
        return (lead.custom_fields or {}).get(name[len(CUSTOM):])
    return lead.source_id if name == "source" else getattr(lead, name)


def choose(survivor: Lead, duplicates: Sequence[Lead], prefer: Mapping[str, Lead]) -> dict[str, Lead]:
    """field -> the lead whose value the survivor takes, for each field that comes from a duplicate."""
    keys = {key for lead in (survivor, *duplicates) for key in (lead.custom_fields or {})}
    taken = {}
    for name in (*FIELDS, *(CUSTOM + key for key in sorted(keys))):
        preferred = prefer.get(name)
        if preferred is not None and _value(preferred, name) not in EMPTY:
            giver = preferred
        elif _value(survivor, name) not in EMPTY:
            giver = survivor
        else:
            giver = next((lead for lead in duplicates if _value(lead, name) not in EMPTY), survivor)
        if giver is not survivor and _value(giver, name) != _value(survivor, name):
            taken[name] = giver
    return taken


# What an undo compares and restores on the survivor, beside the chosen fields.
KEPT = ("do_not_contact", "consent")


def snapshot(lead: Lead) -> dict[str, Any]:
    """The survivor's merged fields as JSON, to compare and restore (an amount as its exact text)."""
    values = {name: getattr(lead, name) for name in ("first_name", "last_name", "phone", "email", *KEPT)}
    value = lead.estimated_value
    return {**values, "source": lead.source_id, "estimated_value": None if value is None else str(value),
            "custom_fields": dict(lead.custom_fields or {})}


def restore(lead: Lead, name: str, value: Any) -> None:
    if name == "source":
        lead.source = value
    elif name == "estimated_value":
        lead.estimated_value = None if value is None else Decimal(value)
    else:
        setattr(lead, name, value)


def _latest_consent(leads: Sequence[Lead]) -> dict[str, Any] | None:
    """The consent the survivor shows: a withdrawal on any merged lead wins (the person said no),
    the latest one; else the survivor's own, else the first duplicate's."""
    withdrawn = [lead.consent for lead in leads if lead.consent and lead.consent.get("withdrawn_at")]
    if withdrawn:
        return max(withdrawn, key=lambda consent: consent["withdrawn_at"])
    return next((lead.consent for lead in leads if lead.consent), None)


def _apply(survivor: Lead, duplicates: Sequence[Lead], taken: Mapping[str, Lead], refs: Refs) -> None:
    """Set the survivor (not saved) as the merge makes it: the chosen fields, do_not_contact,
    consent, engagement, last activity, and the score."""
    custom = dict(survivor.custom_fields or {})
    for name, giver in taken.items():
        if name.startswith(CUSTOM):
            custom[name[len(CUSTOM):]] = _value(giver, name)
        else:
            restore(survivor, name, _value(giver, name))
    survivor.custom_fields = custom
    everyone = (survivor, *duplicates)
    survivor.do_not_contact = any(lead.do_not_contact for lead in everyone)
    survivor.consent = _latest_consent(everyone)
    survivor.engagement += sum(lead.engagement for lead in duplicates)
    latest = max((lead.last_activity_at for lead in everyone if lead.last_activity_at), default=None)
    survivor.last_activity_at, survivor.activity_sort_at = latest, latest or NEVER
    survivor.phone_reversed = search.phone_reversed(survivor.phone)
    survivor.name_key = search.name_key(survivor.first_name, survivor.last_name)
    rescore(survivor, refs)


# --- merging -----------------------------------------------------------------------------------

def _locked(public_ids: Sequence[str], actor: Actor) -> dict[str, Lead]:
    """The leads by public id, locked in id order, each in the actor's scope (else 404) and
    neither merged nor erased (409)."""
    rows = for_update(Lead.select().where((Lead.workspace == actor.workspace.id) & Lead.public_id.in_(public_ids))
                      .order_by(Lead.id))
    found = {lead.public_id: lead for lead in rows}
    for public_id in public_ids:
        lead = found.get(public_id)
        if lead is None or not actor.sees(lead):
            raise NotFound(f"No lead {public_id}.")
    for public_id in public_ids:
        lead = found[public_id]
        if lead.merged_into_id is not None:
            raise Conflict(f"Lead {public_id} was already merged into another lead.")
        if lead.erased_at is not None:
            raise Conflict(f"Lead {public_id} was erased: it can no longer be merged.")
    return found


def moves_of(lead_ids: Sequence[int]) -> dict[str, int]:
    """How many rows of each counted kind of history the leads hold (a dry run's `moves`)."""
    return {name: model.select().where(model.lead.in_(lead_ids)).count() for _, model, name in HISTORY if name}


def merge_leads(survivor: Lead, data: Mapping[str, Any], actor: Actor, refs: Refs) -> Merged:
    """Merge data["duplicates"] into the survivor (a lead the caller sees), or in a dry run say
    what that would make of it."""
    ids = list(data["duplicates"])
    prefer_ids = dict(data.get("prefer") or {})
    check_request(survivor.public_id, ids, prefer_ids, refs)
    with transaction():
        found = _locked([survivor.public_id, *ids], actor)
        survivor, duplicates = found[survivor.public_id], [found[public_id] for public_id in ids]
        taken = choose(survivor, duplicates, {name: found[lead_id] for name, lead_id in prefer_ids.items()})
        before = snapshot(survivor)
        _apply(survivor, duplicates, taken, refs)
        if data.get("dry_run"):
            return Merged(survivor, duplicates=duplicates, moves=moves_of([lead.id for lead in duplicates]))
        merge = _merge(survivor, duplicates, taken, before, actor, refs)
    return Merged(survivor, merge, duplicates)


def _merge(survivor: Lead, duplicates: Sequence[Lead], taken: Mapping[str, Lead], before: dict[str, Any],
           actor: Actor, refs: Refs) -> Merge:
    """Write the merge the survivor (set by _apply, unsaved) stands for (in the caller's transaction)."""
    now = utcnow()
    dup_ids = [lead.id for lead in duplicates]
    # A contact point the survivor takes goes from its tombstone, which takes the survivor's own:
    # every phone and e-mail of the merged leads stays on one of them, and the unique indexes hold.
    tombstones = {lead.id: {"phone": lead.phone, "email": lead.email, "response_due_at": rfc3339(lead.response_due_at)}
                  for lead in duplicates}
    swapped = {lead.id: {} for lead in duplicates}
    for name in ("phone", "email"):
        if name in taken:
            swapped[taken[name].id][name] = before[name]
    for lead in duplicates:
        if swapped[lead.id]:
            Lead.update(**dict.fromkeys(swapped[lead.id])).where(Lead.id == lead.id).execute()
        lead.merged_into, lead.response_due_at, lead.response_sort_at = survivor.id, None, NO_TASK
        for name, value in swapped[lead.id].items():
            setattr(lead, name, value)
        lead.phone_reversed = search.phone_reversed(lead.phone)
        lead.updated_at, lead.version = now, lead.version + 1
    lead_timers.touched(survivor, refs)
    survivor.updated_at, survivor.version = now, survivor.version + 1
    survivor.save()
    for lead in duplicates:
        lead.save()
    clock.disarm(lead_timers.RESPONSE_OVERDUE, dup_ids)
    clock.disarm(lead_timers.STALE, dup_ids)
    if "first_name" in taken or "last_name" in taken:
        search.save_name_parts([survivor], replace=True)

    merge = Merge.create(workspace=survivor.workspace_id, survivor=survivor.id, duplicates=dup_ids, before=before,
                         after=snapshot(survivor), tombstones=tombstones, actor_token=actor.token,
                         actor_member=actor.member, created_at=now)
    # Open tasks whose assignee would not see the survivor go to its owner (a task never widens a scope).
    allowed = [member.id for member in refs.members.values() if member_sees_lead(member, survivor)]
    reassigned = {}
    if survivor.owner_id is not None:
        reassigned = dict(Task.select(Task.id, Task.assignee).where(
            Task.lead.in_(dup_ids) & (Task.state == "open") & Task.assignee.not_in(allowed or [0])).tuples())
        if reassigned:
            Task.update(assignee=survivor.owner_id, version=Task.version + 1, updated_at=now).where(
                Task.id.in_(list(reassigned))).execute()
            merge.reassigned = {str(task_id): assignee for task_id, assignee in reassigned.items()}
            merge.save()
    for kind, model, _ in HISTORY:
        # Literals, not parameters: PostgreSQL cannot type a parameter in an INSERT's SELECT list.
        MergeMove.insert_from(
            model.select(pw.SQL(str(int(merge.id))), pw.SQL(f"'{kind}'"), model.id, model.lead)
            .where(model.lead.in_(dup_ids)),
            fields=[MergeMove.merge, MergeMove.kind, MergeMove.row_id, MergeMove.lead]).execute()
        moved = {"lead": survivor.id}
        if model is Task:
            moved.update(lead_owner=survivor.owner_id, lead_team=survivor.team_id)
        model.update(**moved).where(model.lead.in_(dup_ids)).execute()
    for lead in (survivor, *duplicates):
        followups.sync_lead(lead)
    for task in Task.select().where(Task.id.in_(list(reassigned))) if reassigned else ():
        followups.arm_reminders(task)

    merged = [lead.public_id for lead in duplicates]
    changes = {"merged": {"old": None, "new": merged}, "merge": {"old": None, "new": merge.public_id}}
    after = merge.after
    for name in (*FIELDS, "custom_fields", *KEPT):
        if before[name] != after[name]:
            changes[name] = {"old": _shown(name, before[name], refs), "new": _shown(name, after[name], refs)}
    record_audit(survivor, actor, "merged", changes)
    events.record(refs, "lead.merged", survivor, lambda: {"merged": merged, "merge": merge.public_id})
    return merge


def _shown(name: str, value: Any, refs: Refs) -> Any:
    """A snapshot value as an audit entry shows it: a source by its public id, an amount as a number."""
    if name == "source":
        source = refs.sources.get(value)
        return source.public_id if source else None
    if name == "estimated_value" and value is not None:
        return float(value)
    if name == "consent" and value is not None:
        return value.get("id")
    return value


# --- undoing -----------------------------------------------------------------------------------

def visible_merge_or_404(public_id: str) -> Merge:
    """A merge whose survivor the caller sees (a merge of leads outside the scope is 404 like a missing one)."""
    who = caller()
    merge = Merge.select().where((Merge.public_id == public_id) & (Merge.workspace == who.workspace.id)).first()
    # A survivor merged again is still this merge's: its undo is then a 409, not a 404.
    if merge is None or not in_lead_scope(who, Lead.get_by_id(merge.survivor_id)):
        raise NotFound(f"No merge {public_id}.")
    return merge


def undo_merge(merge: Merge, actor: Actor, refs: Refs) -> tuple[Merge, Lead, list[Lead]]:
    """Give each duplicate back its own fields, history and contact points, and the survivor
    what it held before, apart from changes made since (409 when it cannot be undone)."""
    now = utcnow()
    with transaction():
        merge = for_update(Merge.select().where(Merge.id == merge.id)).get()
        ids = [merge.survivor_id, *merge.duplicates]
        leads = {lead.id: lead for lead in for_update(Lead.select().where(Lead.id.in_(ids)).order_by(Lead.id))}
        survivor, duplicates = leads[merge.survivor_id], [leads[lead_id] for lead_id in merge.duplicates]
        if not actor.sees(survivor):   # reassigned since the view found it
            raise NotFound(f"No merge {merge.public_id}.")
        _check_undoable(merge, survivor, duplicates, now)

        # The survivor: each field that still holds what the merge gave it goes back.
        current = snapshot(survivor)
        restored = []
        for name, value in merge.before.items():
            if name == "custom_fields":
                custom, given = dict(survivor.custom_fields or {}), merge.after[name]
                for key in sorted({*value, *given}):
                    if custom.get(key) == given.get(key) != value.get(key):
                        custom.pop(key, None) if value.get(key) is None else custom.update({key: value[key]})
                        restored.append(CUSTOM + key)
                survivor.custom_fields = custom
            elif current[name] == merge.after[name] and current[name] != value:
                restore(survivor, name, value)
                restored.append(name)
        survivor.engagement = max(0, survivor.engagement - sum(lead.engagement for lead in duplicates))
        # Contact points: off the tombstones first, so that the unique indexes never see one twice.
        Lead.update(phone=None, email=None).where(Lead.id.in_(merge.duplicates)).execute()
        survivor.updated_at, survivor.version = now, survivor.version + 1
        survivor.phone_reversed = search.phone_reversed(survivor.phone)
        survivor.name_key = search.name_key(survivor.first_name, survivor.last_name)
        survivor.save()
        # A member deactivated since the merge takes nothing back: the survivor's owner, who has
        # kept the person since, keeps a duplicate of theirs and its open tasks.
        left = _deactivated({lead.owner_id for lead in duplicates} | {*(merge.reassigned or {}).values()})
        handed = {}
        for lead in duplicates:
            kept = merge.tombstones[str(lead.id)]
            if lead.owner_id in left:
                handed[lead.id] = {"old": left[lead.owner_id],
                                   "new": survivor.owner.public_id if survivor.owner_id is not None else None}
                lead.owner, lead.team = survivor.owner_id, survivor.team_id
            lead.phone, lead.email = kept["phone"], kept["email"]
            lead.response_due_at = datetime.fromisoformat(kept["response_due_at"].rstrip("Z")) \
                if kept["response_due_at"] else None
            lead.response_sort_at = lead.response_due_at or NO_TASK
            lead.phone_reversed = search.phone_reversed(lead.phone)
            lead.merged_into, lead.updated_at, lead.version = None, now, lead.version + 1
        try:
            with transaction():
                for lead in duplicates:
                    lead.save()
        except pw.IntegrityError:
            raise Conflict("A phone or e-mail of a merged lead now belongs to another lead: the merge cannot be "
                           "undone.") from None

        # The history goes back where it came from; what was added to the survivor since stays.
        for kind, model, _ in HISTORY:
            for lead in duplicates:
                back = {"lead": lead.id}
                if model is Task:
                    back.update(lead_owner=lead.owner_id, lead_team=lead.team_id)
                model.update(**back).where(model.id.in_(MergeMove.select(MergeMove.row_id).where(
                    (MergeMove.merge == merge.id) & (MergeMove.kind == kind) & (MergeMove.lead == lead.id)))).execute()
        for task_id, assignee in (merge.reassigned or {}).items():
            if assignee in left:
                continue
            Task.update(assignee=assignee, version=Task.version + 1, updated_at=now).where(
                (Task.id == int(task_id)) & (Task.state == "open") & (Task.assignee == survivor.owner_id)).execute()
        MergeMove.delete().where(MergeMove.merge == merge.id).execute()

        for lead in (survivor, *duplicates):
            latest = (Activity.select(pw.fn.MAX(Activity.occurred_at).python_value(Activity.occurred_at.python_value))
                      .where((Activity.lead == lead.id) & Activity.kind.in_(CONTACT_KINDS)).scalar())
            lead.last_activity_at, lead.activity_sort_at = latest, latest or NEVER
            rescore(lead, refs)
            lead_timers.touched(lead, refs)
            lead.save()
            followups.sync_lead(lead)
        for lead in duplicates:
            lead_timers.arm_new(lead)
        if any(name in restored for name in ("first_name", "last_name")):
            search.save_name_parts([survivor], replace=True)

        merge.undone_at = now
        merge.save()
        unmerged = [lead.public_id for lead in duplicates]
        record_audit(survivor, actor, "unmerged", {"merge": {"old": merge.public_id, "new": None},
                                                   "unmerged": {"old": unmerged, "new": None},
                                                   **({"restored": {"old": None, "new": sorted(restored)}}
                                                      if restored else {})})
        for lead in duplicates:
            record_audit(lead, actor, "unmerged", {"merge": {"old": merge.public_id, "new": None},
                                                   "merged_into": {"old": survivor.public_id, "new": None},
                                                   **({"owner": handed[lead.id]} if lead.id in handed else {})})
        events.record(refs, "lead.unmerged", survivor, lambda: {"unmerged": unmerged, "merge": merge.public_id})
    return merge, survivor, duplicates


def _deactivated(member_ids: set[int | None]) -> dict[int, str]:
    """Those of these members who are deactivated, by internal id: their public ids."""
    ids = [member_id for member_id in member_ids if member_id is not None]
    return dict(Member.select(Member.id, Member.public_id).where(Member.id.in_(ids) & ~Member.active).tuples()) \
        if ids else {}


def _check_undoable(merge: Merge, survivor: Lead, duplicates: Sequence[Lead], now: datetime) -> None:
    if merge.undone_at is not None:
        raise Conflict(f"Merge {merge.public_id} was already undone.")
    if now - merge.created_at > UNDO_WITHIN:
        raise Conflict(f"Merge {merge.public_id} is more than {UNDO_WITHIN.days} days old: it can no longer be undone.")
    if merge.before is None or any(lead.erased_at is not None for lead in (survivor, *duplicates)):
        raise Conflict(f"A lead of merge {merge.public_id} was erased: it can no longer be undone.")
    if survivor.merged_into_id is not None or any(lead.merged_into_id != survivor.id for lead in duplicates):
        raise Conflict(f"A lead of merge {merge.public_id} was merged again: undo that merge first.")


# --- the groups erasure and subject access follow ----------------------------------------------

def merged_group(lead_ids: Sequence[int]) -> list[int]:
    """The leads joined to these by merges, either way and through every merge (survivors and
    tombstones alike), with these: a person's data may sit on any of them."""
    group, frontier = set(lead_ids), set(lead_ids)
    while frontier:
        joined = {survivor for (survivor,) in Lead.select(Lead.merged_into).where(
            Lead.id.in_(list(frontier)) & Lead.merged_into.is_null(False)).tuples()}
        joined |= {lead_id for (lead_id,) in Lead.select(Lead.id).where(Lead.merged_into.in_(list(frontier))).tuples()}
        frontier = joined - group
        group |= frontier
    return sorted(group)


def forget(lead_ids: Sequence[int]) -> None:
    """An erasure's part: the merges of these leads lose what they kept of them (their merged
    fields and contact points). They cannot be undone any more."""
    Merge.update(before=None, after=None, tombstones=None).where(Merge.survivor.in_(list(lead_ids))).execute()


# --- the API -----------------------------------------------------------------------------------

blp = Blueprint("merges", __name__, url_prefix="/api/v1",
                description="Merge duplicate leads into one, and undo a merge within 30 days.")


def merge_ref(merge: Merge, duplicates: Sequence[Lead]) -> dict[str, Any]:
    return {"id": merge.public_id, "merged": [lead.public_id for lead in duplicates],
            "undone_at": rfc3339(merge.undone_at)}


@blp.route("/leads/<lead_id:public_id>/merge")
class LeadMerge(MethodView):
    @blp.doc(operationId="mergeLeads")
    @requires("leads:update")
    @blp.arguments(MergeSchema())
    @blp.response(200, MergeResultSchema, headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data, public_id):
        """Merge up to 4 duplicates into this lead (or, with dry_run, see what that would make)"""
        refs = request_refs()
        merged = merge_leads(visible_lead_or_404(public_id), data, actor(), refs)
        document = lead_document(merged.survivor, refs)
        if merged.merge is None:
            return prebuilt_response({"data": document, "moves": merged.moves})
        return prebuilt_response({"data": document, "merge": merge_ref(merged.merge, merged.duplicates)},
                                 headers={"ETag": etag(merged.survivor)})


@blp.route("/merges/<merge_id:public_id>/undo")
class MergeUndo(MethodView):
    @blp.doc(operationId="undoMerge")
    @requires("leads:update")
    @blp.response(200, UndoResultSchema)
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id):
        """Undo a merge (within 30 days, while none of its leads was erased or merged again)"""
        refs = request_refs()
        merge, survivor, duplicates = undo_merge(visible_merge_or_404(public_id), actor(), refs)
        return prebuilt_response({"data": lead_document(survivor, refs), "merge": merge_ref(merge, duplicates),
                                  "restored": [lead_document(lead, refs) for lead in duplicates]})
