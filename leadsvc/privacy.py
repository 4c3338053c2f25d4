"""Privacy (India's DPDP Act 2023): erasing a lead's personal data, and what is held about a person.

Erasure anonymises the lead in place, in one transaction: its contact, its personal custom fields,
its attribution's click ids and sender's id, its notes' bodies, its activities' summaries and
data, its tasks' titles, notes and outcomes, its transitions' notes, its consents' client addresses
and the raw payloads its connectors received are cleared, and its audit entries keep who changed
which field when with "[erased]" for the personal values. Status, owner, team, source, score,
channel, campaign, transitions and times stay, so reports come out the same. Search (name parts,
reversed phone), duplicate detection (phone and e-mail are null) and recorded idempotent responses
lose it too; the deliveries log drops the receivers' answers to its events. Rows of CSV imports
still waiting in a job that carry the phone or e-mail are blanked, so the import never creates
the person again.
"""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from . import consent, events, idempotency, jobs, merge
from .auth import caller, requires, visible_lead_or_404
from .conditional import ETAG_HEADER, etag, lock_lead
from .db import for_update, transaction
from .documents import (ActorNames, ErasuresSchema, LeadSchema, SubjectSchema, activity_document, audit_document,
                        consent_document, prebuilt_response, lead_document, note_document, one, task_documents,
                        transition_document)
from .extensions import Blueprint
from .fields import normalize_mobile, trim
from .history import Actor, actor, plain, record_audit
from .models import (Activity, AuditEntry, Connector, Consent, Form, Intake, Lead, LeadNamePart, Note, Task, Token,
                     Transition, Workspace, utcnow)
from .pipeline import leads_with_contact
from .refs import Refs, request_refs
from .schemas import EraseSchema, PersonErasureSchema, SubjectQuery

ERASED = "[erased]"
# Audit fields that hold the person's own data (a note's body, a task's title, notes and outcome:
# free text about them); custom fields are personal by their definition.
PERSONAL_FIELDS = frozenset({"first_name", "last_name", "phone", "email", "body", "title", "notes", "outcome"})
# Attribution that points at the person: click ids and a sender's own id, by which an ad platform
# or a marketplace finds them. Campaigns and UTM parameters describe the ad, and reports group by them.
PERSONAL_ATTRIBUTION = frozenset({"external_id", "gclid", "fbclid"})


def erase_lead(lead: Lead, reason: str, actor: Actor, refs: Refs) -> Lead:
    """Erase one lead's personal data (409 if it already was), and that of the leads merged with
    it (merge.merged_group): the same person's."""
    with transaction():
        current = lock_lead(lead, actor)   # an erased lead is 409 here
        _erase(current, reason, actor, refs)
        _erase_merged([current.id], reason, actor, refs)
    return current


def erase_person(phone: str | None, email: str | None, reason: str, actor: Actor, refs: Refs) -> list[str]:
    """Erase every lead of the actor's workspace with this phone or this e-mail, and the leads
    merged with them (survivors and tombstones alike); their public ids."""
    with transaction():
        forget_waiting_rows(actor.workspace, [phone, email])
        query = leads_with_contact(actor.workspace.id, phone, email)
        # Locked in one statement, in id order: a lead erased on its own meanwhile is then waited
        # for and no longer matches (its contact is null), instead of a 409 for the whole person.
        found = [lead.id for lead in for_update(query.order_by(Lead.id))] if query is not None else []
        return _erase_merged(found, reason, actor, refs) if found else []


def _erase_merged(lead_ids: list[int], reason: str, actor: Actor, refs: Refs) -> list[str]:
    """Erase the leads merged with these (and these), those not erased yet, locked in id order;
    their merges forget what they kept of them. The public ids erased."""
    group = merge.merged_group(lead_ids)
    erased = []
    merge.forget(group)
    for current in for_update(Lead.select().where((Lead.workspace == actor.workspace.id) & Lead.id.in_(group)
                                                  & Lead.erased_at.is_null()).order_by(Lead.id)):
        _erase(current, reason, actor, refs)
        erased.append(current.public_id)
    return erased


def _erase(lead: Lead, reason: str, actor: Actor, refs: Refs) -> None:
    """Anonymise a locked lead and its history (in the caller's transaction)."""
    personal = {name for name, field in refs.custom_fields.items() if field.personal}
    held = [value for value in (lead.phone, lead.email) if value]
    now = utcnow()
    lead.first_name = lead.last_name = ""
    lead.phone = lead.email = lead.phone_reversed = lead.name_key = None
    lead.custom_fields = {key: value for key, value in (lead.custom_fields or {}).items() if key not in personal}
    # The score stays (reports band by it); a reason that names a personal value loses the value.
    lead.score_reasons = [_scrub_reason(reason_, personal) for reason_ in lead.score_reasons or []]
    if lead.consent is not None:
        lead.consent = {**lead.consent, "ip": None}
    if lead.attribution:
        lead.attribution = {key: value for key, value in lead.attribution.items()
                            if key not in PERSONAL_ATTRIBUTION} or None
    lead.erased_at = lead.updated_at = now
    lead.version += 1
    lead.save()

    LeadNamePart.delete().where(LeadNamePart.lead == lead.id).execute()
    Note.update(body=None).where(Note.lead == lead.id).execute()
    Activity.update(summary=None, data=None).where(Activity.lead == lead.id).execute()
    Transition.update(note=None).where(Transition.lead == lead.id).execute()
    # Kinds, states and times stay: what was planned and done when, without what it said.
    Task.update(title=None, notes=None, outcome=None).where(Task.lead == lead.id).execute()
    Consent.update(ip=None).where(Consent.lead == lead.id).execute()
    # What senders sent about the person, kept with their intakes (found by lead: intake_lead_id).
    Intake.update(payload=None).where(Intake.lead == lead.id).execute()
    for entry_id, changes in AuditEntry.select(AuditEntry.id, AuditEntry.changes).where(
            AuditEntry.lead == lead.id).tuples():
        scrubbed = _scrub_changes(changes or {}, personal)
        if scrubbed != changes:
            AuditEntry.update(changes=scrubbed).where(AuditEntry.id == entry_id).execute()
    idempotency.forget(lead.public_id, held)
    forget_waiting_rows(refs.workspace, held)
    events.forget(lead)
    record_audit(lead, actor, "erased", {"erased_at": {"old": None, "new": plain(now)},
                                         "reason": {"old": None, "new": reason}})
    events.record(refs, "lead.erased", lead)


def forget_waiting_rows(workspace: Workspace, contacts: list[str | None]) -> None:
    """Blank the rows of imports still waiting in a job whose phone (as a create normalizes it)
    or e-mail is one of these."""
    held = {value for value in contacts if value}
    if not held:
        return

    def names_the_person(cells: dict[str, str]) -> bool:
        phone, email = trim(cells.get("phone") or ""), trim(cells.get("email") or "").lower()
        return (email in held) or bool(phone) and normalize_mobile(phone, workspace.phone_regions) in held

    jobs.forget_rows(workspace.id, names_the_person)


def _scrub_changes(changes: dict[str, Any], personal: set[str]) -> dict[str, Any]:
    """An audit entry's changes with each personal value (not null) replaced by "[erased]"."""
    out = {}
    for name, change in changes.items():
        key = name.removeprefix("custom_fields.")
        if name in PERSONAL_FIELDS or (name != key and key in personal):
            change = {side: None if value is None else ERASED for side, value in change.items()}
        elif name in ("custom_fields", "attribution"):   # a create's whole set of either
            hidden = personal if name == "custom_fields" else PERSONAL_ATTRIBUTION
            change = {side: {k: ERASED if k in hidden else v for k, v in value.items()} if isinstance(value, dict)
                      else value for side, value in change.items()}
        out[name] = change
    return out


def _scrub_reason(reason: dict[str, Any], personal: set[str]) -> dict[str, Any]:
    name, _, _ = reason["reason"].removeprefix("custom_field:").partition("=")
    if reason["reason"].startswith("custom_field:") and name in personal:
        return {**reason, "reason": f"custom_field:{name}={ERASED}"}
    return reason


# --- subject access --------------------------------------------------------------------------

def subject_document(workspace: Workspace, phone: str | None, email: str | None, refs: Refs) -> dict[str, Any]:
    """Everything the workspace holds about the person with this phone or e-mail (SubjectSchema)."""
    query = leads_with_contact(workspace.id, phone, email)
    found = [lead_id for (lead_id,) in query.select(Lead.id).tuples()] if query is not None else []
    # The leads merged with them too: a merged lead's history is on its survivor.
    leads = list(Lead.select().where(Lead.id.in_(merge.merged_group(found))).order_by(Lead.id)) if found else []
    survivors = {lead.id: lead.public_id for lead in leads}
    return {"leads": [{**_everything(lead, refs), **({"merged_into": survivors.get(lead.merged_into_id)}
                                                     if lead.merged_into_id else {})} for lead in leads]}


def _everything(lead: Lead, refs: Refs) -> dict[str, Any]:
    """A lead's document with all of its history: activities and notes newest first (as include
    gives them), tasks, transitions, consents and audit entries oldest first (as their lists do)."""
    activities = list(Activity.select().where(Activity.lead == lead.id)
                      .order_by(Activity.created_at.desc(), Activity.public_id.desc()))
    notes = list(Note.select().where(Note.lead == lead.id).order_by(Note.created_at.desc(), Note.public_id.desc()))
    transitions = list(Transition.select().where(Transition.lead == lead.id)
                       .order_by(Transition.at, Transition.public_id))
    audit = list(AuditEntry.select().where(AuditEntry.lead == lead.id).order_by(AuditEntry.at, AuditEntry.public_id))
    consents = list(Consent.select().where(Consent.lead == lead.id).order_by(Consent.id))
    tasks = list(Task.select().where(Task.lead == lead.id).order_by(Task.created_at, Task.public_id))
    names = ActorNames([*activities, *notes, *transitions, *audit], refs)
    sources = _consent_sources(consents)
    return {**lead_document(lead, refs),
            "activities": [activity_document(row, names) for row in activities],
            "notes": [note_document(row, names) for row in notes],
            "tasks": task_documents(tasks, refs),
            "transitions": [transition_document(row, names) for row in transitions],
            "consents": [consent_document(row, sources.get(row.id)) for row in consents],
            "audit": [audit_document(row, names) for row in audit]}


def _consent_sources(consents: list[Consent]) -> dict[int, str | None]:
    """Consent id -> the public id of the form, connector or token that recorded it."""
    found: dict[tuple[str, int], str] = {}
    for kind, model in (("form", Form), ("connector", Connector), ("token", Token)):
        ids = {getattr(c, f"{kind}_id") for c in consents if getattr(c, f"{kind}_id")}
        if ids:
            found.update(((kind, row_id), public_id)
                         for row_id, public_id in model.select(model.id, model.public_id).where(model.id.in_(ids)).tuples())
    return {c.id: next((found[kind, getattr(c, f"{kind}_id")] for kind in ("form", "connector", "token")
                        if getattr(c, f"{kind}_id")), None) for c in consents}


# --- the API ---------------------------------------------------------------------------------

blp = Blueprint("privacy", __name__, url_prefix="/api/v1",
                description="Privacy (DPDP Act): erase a lead or a person, read what is held about a person, "
                            "withdraw consent.")


@blp.route("/leads/<lead_id:public_id>/erase")
class LeadErasure(MethodView):
    @blp.doc(operationId="eraseLead")
    @requires("privacy:manage")
    @blp.arguments(EraseSchema())
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data, public_id):
        """Erase a lead's personal data (its history and reports stay, anonymised)"""
        refs = request_refs()
        lead = erase_lead(visible_lead_or_404(public_id), data["reason"], actor(), refs)
        return prebuilt_response({"data": lead_document(lead, refs)}, headers={"ETag": etag(lead)})


@blp.route("/leads/<lead_id:public_id>/consent/withdraw")
class LeadConsentWithdrawal(MethodView):
    @blp.doc(operationId="withdrawLeadConsent")
    @requires("leads:update")
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id):
        """Record that the person withdrew consent, and make the lead do-not-contact"""
        lead = consent.withdraw_consent(visible_lead_or_404(public_id), actor(), request_refs())
        return prebuilt_response({"data": lead_document(lead, request_refs())}, headers={"ETag": etag(lead)})


@blp.route("/privacy/erasures")
class PersonErasures(MethodView):
    @blp.doc(operationId="erasePerson")
    @requires("privacy:manage")
    @blp.arguments(PersonErasureSchema())
    @blp.response(200, one(ErasuresSchema))
    def post(self, data):
        """Erase every lead of a person, found by phone and/or e-mail"""
        erased = erase_person(data.get("phone"), data.get("email"), data["reason"], actor(), request_refs())
        return {"data": {"erased": erased}}


@blp.route("/privacy/subject")
class Subject(MethodView):
    @blp.doc(operationId="getDataSubject")
    @requires("privacy:manage")
    @blp.arguments(SubjectQuery(), location="query", unknown=ma.RAISE)
    @blp.response(200, one(SubjectSchema))
    def get(self, query):
        """Everything the workspace holds about a person, found by phone or e-mail"""
        return prebuilt_response({"data": subject_document(caller().workspace, query.get("phone"), query.get("email"),
                                                       request_refs())})
