"""The /api/v1/leads blueprint: views only. The work is in pipeline.py and listing.py."""

from __future__ import annotations

from typing import Any

from flask import request
from flask.views import MethodView

from . import pipeline
from .auth import may, require, requires, visible_lead_or_404, visible_leads
from .conditional import ETAG_HEADER, etag
from .config import settings
from .documents import (ActorNames, LeadBatchResultSchema, LeadCreatedSchema, LeadDuplicateSchema, LeadListMetaSchema,
                        LeadSchema, StatusMoveResultSchema, activity_document, prebuilt_response, lead_document,
                        note_document, one, page_of, task_documents, transition_document)
from .extensions import Blueprint
from .history import actor
from .listing import LeadListQuery, lead_page, page_document, unknown_filters
from .models import Activity, Note, Task
from .refs import Refs, request_refs
from .schemas import LeadBatchSchema, LeadCreateSchema, LeadPatchSchema, LeadReadQuery, StatusMoveSchema

blp = Blueprint("leads", __name__, url_prefix="/api/v1/leads",
                description="Leads in the caller's scope: list, create, read, update, move through the pipeline.")

TIMELINE_LIMIT = 100


def lead_url(public_id: str) -> str:
    """The lead's path, under whatever prefix the app is mounted at: what url_for gives for
    LeadResource, without its URL building, a measurable part of every create. A public id needs no
    quoting."""
    return f"{request.script_root}{blp.url_prefix}/{public_id}"


def create_answer(created: pipeline.Created, refs: Refs) -> dict[str, Any]:
    """The body POST /api/v1/leads answers for what a create did (a batch item's result holds the same)."""
    if not created.duplicate:
        return {"data": lead_document(created.lead, refs), "duplicate": False}
    # A token that may only create learns which lead the contact is, never what it holds.
    document = lead_document(created.lead, refs) if may("leads:read") else {"id": created.lead.public_id}
    body = {"data": document, "duplicate": True, "matched_on": created.matched_on}
    if created.updated_fields is not None:
        body["updated_fields"] = created.updated_fields
    return body


@blp.route("")
class Leads(MethodView):
    @blp.doc(operationId="listLeads")
    @requires("leads:read")
    @blp.arguments(LeadListQuery(), location="query")   # an instance: webargs instantiates a class per request
    @blp.response(200, page_of(LeadSchema, LeadListMetaSchema))
    def get(self, params):
        """List the leads in the caller's scope"""
        unknown = unknown_filters(request.args)
        if unknown:
            return prebuilt_response({"data": [], "links": {"next": None},
                                  "meta": {"has_more": False, "unknown_filters": unknown}})
        refs = request_refs()
        rows, after = lead_page(visible_leads(), params, refs, settings())
        return prebuilt_response(page_document([lead_document(row, refs) for row in rows], after))

    @blp.doc(operationId="createLead")
    @requires("leads:create")
    @blp.arguments(LeadCreateSchema())
    @blp.response(201, LeadCreatedSchema, description="Created; Location points at the new lead.",
                  headers={"Location": {"schema": {"type": "string"}}, **ETAG_HEADER})
    @blp.alt_response(200, schema=LeadDuplicateSchema, success=True,
                      description="A lead with this phone or e-mail exists: nothing was created.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data):
        """Create a lead, or find (and optionally update) the duplicate it matches"""
        refs = request_refs()
        created = pipeline.create_lead(data, actor(), refs)
        body = create_answer(created, refs)
        if created.duplicate:
            return prebuilt_response(body, 200)
        return prebuilt_response(body, 201, {"Location": lead_url(created.lead.public_id),
                                         "ETag": etag(created.lead)})


@blp.route("/batch")
class LeadsBatch(MethodView):
    commits_in_steps = True   # each item commits alone, with an Idempotency-Key too (idempotency.py)

    @blp.doc(operationId="createLeadsBatch")
    @requires("leads:create")
    @blp.arguments(LeadBatchSchema())
    @blp.response(200, LeadBatchResultSchema, description="One result per item, in the order sent.")
    def post(self, batch):
        """Create up to 100 leads, each as POST /api/v1/leads would, in its own transaction"""
        # The request is parsed, authenticated, rate limited and given its reference data once;
        # each item then takes the single create's path.
        refs = request_refs()
        return prebuilt_response(pipeline.create_batch(batch["leads"], actor(), refs,
                                                   lambda created: create_answer(created, refs)))


@blp.route("/<lead_id:public_id>")
class LeadResource(MethodView):
    @blp.doc(operationId="getLead")
    @requires("leads:read")
    @blp.arguments(LeadReadQuery(), location="query")
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(304, description="Not modified: the lead still has the ETag sent in If-None-Match.",
                      headers=ETAG_HEADER, success=True)
    def get(self, query, public_id):
        """Read a lead, optionally with its activities, notes and open tasks"""
        lead = visible_lead_or_404(public_id)
        tag = etag(lead)
        includes = query.get("include", frozenset())
        if not includes and request.if_none_match.contains_raw(tag):
            return prebuilt_response(None, 304, {"ETag": tag})
        refs = request_refs()
        document = lead_document(lead, refs)
        if "activities" in includes:
            rows = list(Activity.select().where(Activity.lead == lead.id)
                        .order_by(Activity.created_at.desc(), Activity.public_id.desc()).limit(TIMELINE_LIMIT))
            names = ActorNames(rows, refs)
            document["activities"] = [activity_document(row, names) for row in rows]
        if "notes" in includes:
            rows = list(Note.select().where(Note.lead == lead.id)
                        .order_by(Note.created_at.desc(), Note.public_id.desc()).limit(TIMELINE_LIMIT))
            names = ActorNames(rows, refs)
            document["notes"] = [note_document(row, names) for row in rows]
        if "tasks" in includes:
            rows = list(Task.select().where((Task.lead == lead.id) & (Task.state == "open"))
                        .order_by(Task.due_at, Task.public_id).limit(TIMELINE_LIMIT))
            document["tasks"] = task_documents(rows, refs)
        return prebuilt_response({"data": document}, headers={"ETag": tag})

    @blp.doc(operationId="updateLead")
    @requires("leads:update")
    @blp.arguments(LeadPatchSchema())
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    def patch(self, changes, public_id):
        """Update the fields sent (owner needs leads:assign)"""
        if "owner" in changes:
            require("leads:assign", "Changing the owner needs the leads:assign ability.")
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        lead = pipeline.update_lead(lead, changes, actor(), refs, if_match=request.headers.get("If-Match")).lead
        return prebuilt_response({"data": lead_document(lead, refs)}, headers={"ETag": etag(lead)})


@blp.route("/<lead_id:public_id>/status")
class LeadStatus(MethodView):
    @blp.doc(operationId="moveLeadStatus")
    @requires("leads:status")
    @blp.arguments(StatusMoveSchema())
    @blp.response(200, StatusMoveResultSchema, headers=ETAG_HEADER)
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    def post(self, move, public_id):
        """Move a lead to another pipeline status"""
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        lead, transition = pipeline.move_status(lead, move["status"], move.get("note"), actor(), refs,
                                                if_match=request.headers.get("If-Match"), reason=move.get("reason"))
        return prebuilt_response({"data": lead_document(lead, refs),
                              "transition": transition_document(transition, ActorNames([transition], refs))},
                             headers={"ETag": etag(lead)})
