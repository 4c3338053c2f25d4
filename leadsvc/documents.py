"""The JSON documents the API returns: each response schema, published in the OpenAPI document
(the reference data, the list and single-resource envelopes, the lead and its history), beside
the function that builds the lead's documents (tests validate every built document against its
schema).

Lead documents are built as plain data from a workspace's cached reference tables (refs.py),
without per-row queries, so a page of leads is one query and no internal id ever reaches a
document.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any, Mapping

import marshmallow as ma
from flask import Response, current_app

from .fields import UtcDateTime, rfc3339
from .models import (CHANNELS, FIELD_TYPES, JOB_ERRORS_KEPT, JOB_KINDS, JOB_STATES, ROLES, STATUS_KINDS, TASK_KINDS,
                     TASK_STATES, Connector, Consent, Form, Lead, Member, Status, Task, Token, utcnow)
from .scoring import band
from .sla import SLA_STATES, state as sla_state

if TYPE_CHECKING:
    from .refs import Refs


def prebuilt_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """The answer of a view that builds its lead documents itself, as plain data, instead of
    returning what its `@blp.response` schema serializes (why: docs/design.md, "Responses")."""
    response = current_app.json.response(payload)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def ref(row: Any) -> dict | None:
    return None if row is None else {"id": row.public_id, "name": row.name}


def status_ref(status: Status) -> dict:
    return {"id": status.public_id, "name": status.name, "kind": status.kind, "position": status.position}


def member_ref(member: Member | None) -> dict | None:
    return None if member is None else {"id": member.public_id, "name": member.name, "role": member.role}


# --- what the documents look like --------------------------------------------------------------

class RefSchema(ma.Schema):
    """A related record: its public id and name."""

    id = ma.fields.String(attribute="public_id", required=True)
    name = ma.fields.String(required=True)


class TeamSchema(RefSchema):
    pass


class LostReasonSchema(RefSchema):
    position = ma.fields.Integer(required=True)


class SourceSchema(RefSchema):
    score = ma.fields.Integer(required=True, metadata={"description": "Points a lead from this source scores."})


class StatusSchema(RefSchema):
    position = ma.fields.Integer(required=True)
    kind = ma.fields.String(required=True, metadata={"enum": list(STATUS_KINDS)})
    next = ma.fields.List(ma.fields.String(), required=True,
                          metadata={"description": "Ids of the statuses a lead may move to from this one."})


class CustomFieldSchema(RefSchema):
    label = ma.fields.String(required=True)
    type = ma.fields.String(required=True, metadata={"enum": list(FIELD_TYPES)})
    options = ma.fields.List(ma.fields.String(), allow_none=True, required=True)
    personal = ma.fields.Boolean(required=True, metadata={
        "description": "Holds personal data: erasing a lead clears this field's value."})


class FormSchema(RefSchema):
    source = ma.fields.Nested(RefSchema, allow_none=True, required=True,
                              metadata={"description": "The source the form's leads get."})
    page_url = ma.fields.String(required=True, metadata={
        "description": "The path of the form's HTML page (under the service's mount prefix), e.g. /forms/form_..."})
    notice = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The privacy notice the form's page shows."})
    notice_version = ma.fields.String(allow_none=True, required=True)
    consent_required = ma.fields.Boolean(required=True, metadata={
        "description": "A submission without `consent` is refused (422)."})


class LinksSchema(ma.Schema):
    next = ma.fields.String(allow_none=True, required=True,
                            metadata={"description": "Relative URL of the next page; null on the last."})


class MetaSchema(ma.Schema):
    has_more = ma.fields.Boolean(required=True)


@cache
def page_of(item: type[ma.Schema], meta: type[ma.Schema] = MetaSchema) -> type[ma.Schema]:
    """The list envelope around a schema: {"data": [...], "links": {"next"}, "meta": {"has_more"}}."""
    name = item.__name__.removesuffix("Schema") + "Page"
    return type(name, (ma.Schema,), {
        "data": ma.fields.List(ma.fields.Nested(item), required=True),
        "links": ma.fields.Nested(LinksSchema, required=True),
        "meta": ma.fields.Nested(meta, required=True),
    })


@cache
def one(item: type[ma.Schema]) -> type[ma.Schema]:
    """The single-resource envelope: {"data": {...}}."""
    name = item.__name__.removesuffix("Schema") + "Document"
    return type(name, (ma.Schema,), {"data": ma.fields.Nested(item, required=True)})


def whole_page(items) -> dict:
    """A list that fits on one page (reference data)."""
    return {"data": list(items), "links": {"next": None}, "meta": {"has_more": False}}



class FormReceiptBodySchema(ma.Schema):
    form = ma.fields.String(required=True)
    message = ma.fields.String(required=True)


class FormReceiptSchema(ma.Schema):
    """What a JSON submission gets back: a receipt, never the lead (the caller is anonymous)."""

    data = ma.fields.Nested(FormReceiptBodySchema, required=True)


class ContactSchema(ma.Schema):
    first_name = ma.fields.String(allow_none=True, required=True, metadata={"description": "Null once erased."})
    last_name = ma.fields.String(allow_none=True, required=True, metadata={"description": "Null once erased."})
    full_name = ma.fields.String(allow_none=True, required=True, metadata={"description": "Null once erased."})
    phone = ma.fields.String(allow_none=True, required=True, metadata={"description": "E.164"})
    email = ma.fields.String(allow_none=True, required=True)


class StatusRefSchema(RefSchema):
    kind = ma.fields.String(required=True, metadata={"enum": list(STATUS_KINDS)})
    position = ma.fields.Integer(required=True)


class MemberRefSchema(RefSchema):
    role = ma.fields.String(required=True, metadata={"enum": list(ROLES)})


class ScoreReasonSchema(ma.Schema):
    reason = ma.fields.String(required=True)
    points = ma.fields.Integer(required=True)


class ActorSchema(ma.Schema):
    type = ma.fields.String(required=True, metadata={"enum": ["token", "form", "connector", "system"]})
    id = ma.fields.String()
    name = ma.fields.String()
    member = ma.fields.Nested(MemberRefSchema, allow_none=True)


ERASED_NOTE = "Null once the lead is erased."


class ActivitySchema(ma.Schema):
    id = ma.fields.String(required=True)
    kind = ma.fields.String(required=True)
    summary = ma.fields.String(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    data = ma.fields.Dict(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    occurred_at = UtcDateTime(required=True)
    created_at = UtcDateTime(required=True)
    actor = ma.fields.Nested(ActorSchema, required=True)


class NoteSchema(ma.Schema):
    id = ma.fields.String(required=True)
    body = ma.fields.String(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    created_at = UtcDateTime(required=True)
    author = ma.fields.Nested(ActorSchema, required=True)


class ConsentSchema(ma.Schema):
    id = ma.fields.String(required=True)
    purpose = ma.fields.String(allow_none=True, required=True)
    notice_version = ma.fields.String(allow_none=True, required=True)
    given_at = UtcDateTime(allow_none=True, required=True, metadata={
        "description": "Null for a withdrawal recorded without an earlier consent."})
    source = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The form (form_...), connector (conn_...) or token (tok_...) that recorded it."})
    ip = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The client address of a form submission; null for API creates, connectors' leads and "
                       "once erased."})
    withdrawn_at = UtcDateTime(allow_none=True, required=True)


class TaskLeadSchema(ma.Schema):
    id = ma.fields.String(required=True)
    full_name = ma.fields.String(allow_none=True, required=True, metadata={"description": "Null once erased."})


class TaskCreatorSchema(ma.Schema):
    token = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The token that created the task; null for one the demo generator made."})
    member = ma.fields.Nested(RefSchema, allow_none=True, required=True)


class TaskSchema(ma.Schema):
    id = ma.fields.String(required=True)
    lead = ma.fields.Nested(TaskLeadSchema, required=True)
    kind = ma.fields.String(required=True, metadata={"enum": list(TASK_KINDS)})
    title = ma.fields.String(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    notes = ma.fields.String(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    due_at = UtcDateTime(required=True)
    remind_at = UtcDateTime(allow_none=True, required=True)
    assignee = ma.fields.Nested(RefSchema, required=True)
    state = ma.fields.String(required=True, metadata={"enum": list(TASK_STATES)})
    done_at = UtcDateTime(allow_none=True, required=True, metadata={"description": "When it was completed."})
    outcome = ma.fields.String(allow_none=True, required=True, metadata={"description": ERASED_NOTE})
    created_at = UtcDateTime(required=True)
    created_by = ma.fields.Nested(TaskCreatorSchema, required=True)
    overdue = ma.fields.Boolean(required=True, metadata={"description": "Open, and due_at has passed."})


class TaskDocumentSchema(ma.Schema):
    data = ma.fields.Nested(TaskSchema, required=True)


class SlaSchema(ma.Schema):
    due_at = UtcDateTime(required=True, metadata={
        "description": "Its creation plus the first-response minutes in working time, as they were when it was created."})
    responded_at = UtcDateTime(allow_none=True, required=True, metadata={
        "description": "Its first response: the earliest contact logged on it or its first move out of the first status."})
    response_seconds = ma.fields.Integer(allow_none=True, required=True, metadata={
        "description": "Working seconds from its creation to responded_at."})
    state = ma.fields.String(required=True, metadata={
        "enum": list(SLA_STATES), "description": "due: no response, not yet due; overdue: no response, past due; "
                                                 "met: responded by due_at; missed: responded after it."})


class AttributionSchema(ma.Schema):
    """Where the lead came from, as it was when it was created (first touch); the keys it was not
    given are left out."""

    channel = ma.fields.String(required=True, metadata={
        "enum": list(CHANNELS), "description": "How it came in: api, form (a web form), import (a CSV file), or the "
                                               "kind of the connector it came through."})
    connector = ma.fields.Nested(RefSchema, allow_none=True, required=True, metadata={
        "description": "The connector it came through; null for the other channels."})
    external_id = ma.fields.String(metadata={"description": "The connector's sender's own id of the lead."})
    campaign_id = ma.fields.String()
    adgroup_id = ma.fields.String()
    ad_id = ma.fields.String()
    form_id = ma.fields.String(metadata={"description": "The ad platform's lead form id."})
    gclid = ma.fields.String()
    fbclid = ma.fields.String()
    utm_source = ma.fields.String()
    utm_medium = ma.fields.String()
    utm_campaign = ma.fields.String()
    utm_term = ma.fields.String()
    utm_content = ma.fields.String()


class LeadSchema(ma.Schema):
    id = ma.fields.String(required=True)
    contact = ma.fields.Nested(ContactSchema, required=True)
    source = ma.fields.Nested(RefSchema, allow_none=True, required=True)
    status = ma.fields.Nested(StatusRefSchema, required=True)
    owner = ma.fields.Nested(MemberRefSchema, allow_none=True, required=True)
    team = ma.fields.Nested(RefSchema, allow_none=True, required=True)
    estimated_value = ma.fields.Float(allow_none=True, required=True)
    currency = ma.fields.String(required=True)
    custom_fields = ma.fields.Dict(required=True)
    score = ma.fields.Integer(required=True)
    score_band = ma.fields.String(required=True, metadata={"enum": ["hot", "warm", "cold"]})
    score_reasons = ma.fields.List(ma.fields.Nested(ScoreReasonSchema), required=True)
    created_at = UtcDateTime(required=True)
    updated_at = UtcDateTime(required=True)
    last_activity_at = UtcDateTime(allow_none=True, required=True)
    status_changed_at = UtcDateTime(required=True)
    lost_reason = ma.fields.Nested(RefSchema, allow_none=True, required=True, metadata={
        "description": "Why the lead was lost: set by the move into the lost status it is in; null in any other status."})
    consent = ma.fields.Nested(ConsentSchema, allow_none=True, required=True, metadata={
        "description": "The latest consent record; null when there is none."})
    do_not_contact = ma.fields.Boolean(required=True)
    erased_at = UtcDateTime(allow_none=True, required=True, metadata={
        "description": "When the lead's personal data was erased; null while it has not been."})
    next_task_due_at = UtcDateTime(allow_none=True, required=True, metadata={
        "description": "The earliest due_at of its open tasks; null when it has none."})
    open_tasks = ma.fields.Integer(required=True, metadata={"description": "How many open tasks it has."})
    sla = ma.fields.Nested(SlaSchema, allow_none=True, required=True, metadata={
        "description": "Its first response against the workspace's [sla]; null without one, and for leads created "
                       "before it was set."})
    stale_since = UtcDateTime(allow_none=True, required=True, metadata={
        "description": "When it went, or will go, stale: its last move or contact plus its status's stale_after_days; "
                       "null in a status without the setting."})
    attribution = ma.fields.Nested(AttributionSchema, required=True)
    activities = ma.fields.List(ma.fields.Nested(ActivitySchema), metadata={"description": "With include=activities."})
    notes = ma.fields.List(ma.fields.Nested(NoteSchema), metadata={"description": "With include=notes."})
    tasks = ma.fields.List(ma.fields.Nested(TaskSchema), metadata={
        "description": "With include=tasks: its open tasks, earliest due first."})


class SubjectLeadSchema(LeadSchema):
    """A lead with everything held about it, for subject access."""

    tasks = ma.fields.List(ma.fields.Nested(TaskSchema), required=True, metadata={
        "description": "All of its tasks, open and closed, oldest first."})
    transitions = ma.fields.List(ma.fields.Nested("TransitionSchema"), required=True)
    consents = ma.fields.List(ma.fields.Nested(ConsentSchema), required=True)
    merged_into = ma.fields.String(metadata={
        "description": "A merged lead (DESIGN section 21): the lead it was merged into, which holds its history."})
    audit = ma.fields.List(ma.fields.Nested("AuditEntrySchema"), required=True)


class SubjectSchema(ma.Schema):
    leads = ma.fields.List(ma.fields.Nested(SubjectLeadSchema), required=True, metadata={
        "description": "Every lead of the workspace with the phone or e-mail asked for, each with its "
                       "activities, notes, tasks, transitions, consents and audit entries."})


class ErasuresSchema(ma.Schema):
    erased = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The ids of the leads erased; empty when none had the phone or e-mail."})


class LeadCreatedSchema(ma.Schema):
    data = ma.fields.Nested(LeadSchema, required=True)
    duplicate = ma.fields.Boolean(required=True, metadata={"enum": [False]})


class LeadDuplicateSchema(ma.Schema):
    data = ma.fields.Raw(required=True, metadata={
        "description": "The lead the contact matched; only its id when the token lacks leads:read.",
        "oneOf": [{"$ref": "#/components/schemas/Lead"},
                  {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
                   "additionalProperties": False}]})
    duplicate = ma.fields.Boolean(required=True, metadata={"enum": [True]})
    matched_on = ma.fields.List(ma.fields.String(metadata={"enum": ["phone", "email"]}), required=True)
    updated_fields = ma.fields.List(ma.fields.String(), metadata={
        "description": "With on_duplicate update or fill_empty: the fields of the lead that changed, named as in "
                       "PATCH (`first_name`, `custom_fields.budget`); empty when none did."})


class BatchItemResultSchema(ma.Schema):
    index = ma.fields.Integer(required=True, metadata={"description": "The item's position in `leads`, from 0."})
    status = ma.fields.Integer(required=True, metadata={
        "enum": [201, 200, 403, 404, 409, 422],
        "description": "What POST /api/v1/leads would have answered for the item: 201 created, 200 duplicate, "
                       "403 an upsert without leads:update, 404 an upserted lead that left the caller's scope "
                       "meanwhile, 409 conflict, 422 invalid."})
    duplicate = ma.fields.Boolean(required=True)
    lead = ma.fields.Raw(allow_none=True, required=True, metadata={
        "description": "The lead (201, 200); only its id for a duplicate when the token lacks leads:read; null "
                       "when the item failed.",
        "oneOf": [{"$ref": "#/components/schemas/Lead"},
                  {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
                   "additionalProperties": False},
                  {"type": "null"}]})
    matched_on = ma.fields.List(ma.fields.String(metadata={"enum": ["phone", "email"]}),
                                metadata={"description": "For a duplicate (200)."})
    updated_fields = ma.fields.List(ma.fields.String(), metadata={
        "description": "For a duplicate with on_duplicate update or fill_empty, as in a single create."})
    errors = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.List(ma.fields.String()), allow_none=True,
                            required=True, metadata={
                                "description": "Field (or `body`) -> messages, for a failed item; null otherwise."})


class BatchMetaSchema(ma.Schema):
    created = ma.fields.Integer(required=True)
    duplicates = ma.fields.Integer(required=True)
    failed = ma.fields.Integer(required=True)


class LeadBatchResultSchema(ma.Schema):
    data = ma.fields.List(ma.fields.Nested(BatchItemResultSchema), required=True,
                          metadata={"description": "One result per item, in the order sent."})
    meta = ma.fields.Nested(BatchMetaSchema, required=True)


class LeadListMetaSchema(MetaSchema):
    unknown_filters = ma.fields.List(ma.fields.String(), metadata={
        "description": "filter[...] keys the service does not know; the page is empty because of them."})


class TransitionSchema(ma.Schema):
    id = ma.fields.String(required=True)
    from_ = ma.fields.Nested(StatusRefSchema, allow_none=True, required=True, data_key="from")
    to = ma.fields.Nested(StatusRefSchema, required=True)
    note = ma.fields.String(allow_none=True, required=True)
    actor = ma.fields.Nested(ActorSchema, required=True)
    at = UtcDateTime(required=True)
    seconds_in_from = ma.fields.Integer(allow_none=True, required=True)
    lost_reason = ma.fields.Nested(RefSchema, allow_none=True, required=True, metadata={
        "description": "The reason given with a move to a lost status; null otherwise."})


class StatusMoveResultSchema(ma.Schema):
    data = ma.fields.Nested(LeadSchema, required=True)
    transition = ma.fields.Nested(TransitionSchema, required=True)


class NoteDocumentSchema(ma.Schema):
    data = ma.fields.Nested(NoteSchema, required=True)


class ActivityLoggedSchema(ma.Schema):
    data = ma.fields.Nested(ActivitySchema, required=True)
    lead = ma.fields.Nested(LeadSchema, required=True, metadata={"description": "The lead as it is now."})


class AuditChangeSchema(ma.Schema):
    old = ma.fields.Raw(allow_none=True, required=True)
    new = ma.fields.Raw(allow_none=True, required=True)


class AuditEntrySchema(ma.Schema):
    id = ma.fields.String(required=True)
    action = ma.fields.String(required=True, metadata={
        "enum": ["created", "updated", "status_changed", "note_added", "note_edited", "note_deleted",
                 "activity_logged", "task_created", "task_updated", "task_completed", "task_cancelled", "consent_given",
                 "consent_withdrawn", "erased", "merged", "unmerged"]})
    changes = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.Nested(AuditChangeSchema), required=True)
    request_id = ma.fields.String(allow_none=True, required=True)
    actor = ma.fields.Nested(ActorSchema, required=True)
    at = UtcDateTime(required=True)


# --- building them -----------------------------------------------------------------------------

# The columns lead_document reads, for queries that select only what a document needs.
LEAD_COLUMNS = (Lead.public_id, Lead.first_name, Lead.last_name, Lead.phone, Lead.email, Lead.source, Lead.status,
                Lead.owner, Lead.team, Lead.estimated_value, Lead.custom_fields, Lead.score, Lead.score_reasons,
                Lead.created_at, Lead.updated_at, Lead.last_activity_at, Lead.status_changed_at, Lead.lost_reason,
                Lead.consent, Lead.do_not_contact, Lead.erased_at, Lead.next_task_due_at, Lead.open_tasks,
                Lead.response_due_at, Lead.first_response_at, Lead.first_response_seconds, Lead.stale_since,
                Lead.channel, Lead.connector, Lead.attribution)



ERASED_CONTACT = {"first_name": None, "last_name": None, "full_name": None, "phone": None, "email": None}


def lead_document(lead: Any, refs: Refs) -> dict[str, Any]:
    """A lead as the API shows it (LeadSchema)."""
    value = lead.estimated_value
    related = refs.refs_of_leads
    if lead.erased_at is None:
        first, last = lead.first_name or "", lead.last_name or ""
        contact = {"first_name": first, "last_name": last, "full_name": f"{first} {last}".strip(),
                   "phone": lead.phone, "email": lead.email}
    else:
        contact = dict(ERASED_CONTACT)
    return {
        "id": lead.public_id,
        "contact": contact,
        "source": related["source"].get(lead.source_id),
        "status": related["status"][lead.status_id],
        "owner": related["owner"].get(lead.owner_id),
        "team": related["team"].get(lead.team_id),
        "estimated_value": None if value is None else float(value),
        "currency": refs.workspace.currency,
        "custom_fields": lead.custom_fields or {},
        "score": lead.score,
        "score_band": band(lead.score, refs.settings),
        "score_reasons": lead.score_reasons or [],
        "created_at": rfc3339(lead.created_at),
        "updated_at": rfc3339(lead.updated_at),
        "last_activity_at": rfc3339(lead.last_activity_at),
        "status_changed_at": rfc3339(lead.status_changed_at),
        "lost_reason": related["lost_reason"].get(lead.lost_reason_id),
        "consent": lead.consent,
        "do_not_contact": lead.do_not_contact,
        "erased_at": rfc3339(lead.erased_at),
        "next_task_due_at": rfc3339(lead.next_task_due_at),
        "open_tasks": lead.open_tasks,
        "sla": sla_document(lead),
        "stale_since": rfc3339(lead.stale_since),
        "attribution": {"channel": lead.channel, "connector": related["connector"].get(lead.connector_id),
                        **(lead.attribution or {})},
    }


def sla_document(lead: Any) -> dict[str, Any] | None:
    """A lead's `sla` object (SlaSchema), or None without a response due time."""
    due = lead.response_due_at
    if due is None:
        return None
    return {"due_at": rfc3339(due), "responded_at": rfc3339(lead.first_response_at),
            "response_seconds": lead.first_response_seconds, "state": sla_state(due, lead.first_response_at, utcnow())}


def task_documents(tasks: list[Task], refs: Refs) -> list[dict[str, Any]]:
    """Tasks as the API shows them (TaskSchema), built by hand like lead documents (docs/design.md,
    Responses), their leads' names and creators' tokens read in one query each."""
    lead_ids = {task.lead_id for task in tasks}
    leads = {row.id: row for row in Lead.select(Lead.id, Lead.public_id, Lead.first_name, Lead.last_name,
                                                  Lead.erased_at).where(Lead.id.in_(lead_ids))} if lead_ids else {}
    tokens = ActorNames(tasks, refs).tokens
    now = utcnow()
    documents = []
    for task in tasks:
        lead = leads[task.lead_id]
        documents.append({
            "id": task.public_id,
            "lead": {"id": lead.public_id, "full_name": None if lead.erased_at else
                     f"{lead.first_name or ''} {lead.last_name or ''}".strip()},
            "kind": task.kind, "title": task.title, "notes": task.notes, "due_at": rfc3339(task.due_at),
            "remind_at": rfc3339(task.remind_at), "assignee": ref(refs.members.get(task.assignee_id)),
            "state": task.state, "done_at": rfc3339(task.done_at), "outcome": task.outcome,
            "created_at": rfc3339(task.created_at),
            "created_by": {"token": tokens.get(task.actor_token_id),
                           "member": ref(refs.members.get(task.actor_member_id))},
            "overdue": task.state == "open" and task.due_at < now,
        })
    return documents


def consent_document(consent: Consent, source: str | None) -> dict[str, Any]:
    """A consent record (ConsentSchema); `source` is the public id of its form, connector or token."""
    return {"id": consent.public_id, "purpose": consent.purpose, "notice_version": consent.notice_version,
            "given_at": rfc3339(consent.given_at), "source": source, "ip": consent.ip,
            "withdrawn_at": rfc3339(consent.withdrawn_at)}


# --- history ---------------------------------------------------------------------------------

class ActorNames:
    """Public ids and names of the tokens, forms and connectors that acted, fetched in one query each."""

    def __init__(self, rows: list[Any], refs: Refs):
        token_ids = {r.actor_token_id for r in rows if r.actor_token_id}
        form_ids = {r.actor_form_id for r in rows if r.actor_form_id}
        connector_ids = {r.actor_connector_id for r in rows if r.actor_connector_id}
        self.tokens = {t.id: t.public_id for t in Token.select(Token.id, Token.public_id).where(Token.id.in_(token_ids))} if token_ids else {}
        self.forms = {f.id: f for f in Form.select(Form.id, Form.public_id, Form.name).where(Form.id.in_(form_ids))} if form_ids else {}
        self.connectors = {c.id: c for c in Connector.select(Connector.id, Connector.public_id, Connector.name)
                           .where(Connector.id.in_(connector_ids))} if connector_ids else {}
        self.refs = refs

    def actor(self, row: Any) -> dict[str, Any]:
        if row.actor_form_id:
            form = self.forms[row.actor_form_id]
            return {"type": "form", "id": form.public_id, "name": form.name}
        if row.actor_connector_id:
            connector = self.connectors[row.actor_connector_id]
            return {"type": "connector", "id": connector.public_id, "name": connector.name}
        if row.actor_token_id:
            return {"type": "token", "id": self.tokens[row.actor_token_id],
                    "member": member_ref(self.refs.members.get(row.actor_member_id))}
        return {"type": "system"}


def activity_document(row: Any, actors: ActorNames) -> dict[str, Any]:
    return {"id": row.public_id, "kind": row.kind, "summary": row.summary, "data": row.data,
            "occurred_at": rfc3339(row.occurred_at), "created_at": rfc3339(row.created_at),
            "actor": actors.actor(row)}


def note_document(row: Any, actors: ActorNames) -> dict[str, Any]:
    return {"id": row.public_id, "body": row.body, "created_at": rfc3339(row.created_at),
            "author": actors.actor(row)}


def transition_document(row: Any, actors: ActorNames) -> dict[str, Any]:
    statuses = actors.refs.statuses
    return {"id": row.public_id,
            "from": status_ref(statuses[row.from_status_id]) if row.from_status_id else None,
            "to": status_ref(statuses[row.to_status_id]), "note": row.note, "actor": actors.actor(row),
            "at": rfc3339(row.at), "seconds_in_from": row.seconds_in_from,
            "lost_reason": ref(actors.refs.lost_reasons.get(row.lost_reason_id))}


def audit_document(row: Any, actors: ActorNames) -> dict[str, Any]:
    return {"id": row.public_id, "action": row.action, "changes": row.changes or {},
            "request_id": row.request_id, "actor": actors.actor(row), "at": rfc3339(row.at)}


class JobErrorSchema(ma.Schema):
    item = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The item: a lead's id, or `row N` of an import (as a spreadsheet numbers rows); null: "
                       "the job itself."})
    code = ma.fields.String(required=True, metadata={"description": "The problem code the single change would answer."})
    detail = ma.fields.String(required=True)


class JobSchema(ma.Schema):
    """A long change run in batches (DESIGN section 20)."""

    id = ma.fields.String(attribute="public_id", required=True)
    kind = ma.fields.String(required=True, metadata={"enum": list(JOB_KINDS)})
    state = ma.fields.String(required=True, metadata={
        "enum": list(JOB_STATES), "description": "succeeded: it ran to its end, even if some items failed; failed: "
                                                  "the job itself stopped."})
    total = ma.fields.Integer(required=True)
    done = ma.fields.Integer(required=True, metadata={"description": "Items processed, failed ones included."})
    failed = ma.fields.Integer(required=True)
    errors = ma.fields.List(ma.fields.Nested(JobErrorSchema), required=True, metadata={
        "description": f"The first {JOB_ERRORS_KEPT} items that failed."})
    created_at = UtcDateTime(required=True)
    finished_at = UtcDateTime(allow_none=True, required=True)
