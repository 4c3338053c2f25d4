"""A lead's timeline and history: add notes, log contacts, list transitions and audit entries.

Views only; the writes are pipeline.add_note, edit_note, delete_note and log_activity. Every route
finds the lead (or the note's lead) through the caller's scope first, so a lead outside it is 404
exactly like a missing one. History lists are oldest first (the order a history is read in); notes
are newest first, as the lead's `include=notes` shows them; all are keyset-paginated on (time, id).
"""

from __future__ import annotations

import peewee as pw
from flask import Response
from flask.views import MethodView

from . import cursor, pipeline
from .auth import requires, visible_lead_or_404, visible_note_or_404
from .documents import (ActivityLoggedSchema, ActorNames, AuditEntrySchema, NoteDocumentSchema, NoteSchema,
                        TransitionSchema, activity_document, audit_document, prebuilt_response, lead_document,
                        note_document, page_of, transition_document)
from .extensions import Blueprint
from .history import actor
from .listing import page_document
from .models import AuditEntry, Lead, Note, Transition
from .refs import request_refs
from .schemas import ActivityCreateSchema, PageQuery, NoteCreateSchema

blp = Blueprint("timeline", __name__, url_prefix="/api/v1",
                description="A lead's timeline (notes, logged contacts) and its history (stage moves, audit).")

HISTORY_ORDERS = {
    "transitions": cursor.Order(Transition.at, Transition.public_id, descending=False),
    "audit": cursor.Order(AuditEntry.at, AuditEntry.public_id, descending=False),
    "notes": cursor.Order(Note.created_at, Note.public_id, descending=True),
}


def history_page(kind: str, model: type[pw.Model], lead: Lead, params: dict, document) -> dict:
    """One page of a lead's transitions, audit entries or notes, in their order, as the list envelope."""
    order = HISTORY_ORDERS[kind]
    # A cursor is bound to the list and the lead it came from.
    binding = cursor.fingerprint(kind, lead.public_id)
    rows, after = cursor.page(model.select().where(model.lead == lead.id), order, params["page_size"],
                              binding, params.get("page_after"))
    names = ActorNames(rows, request_refs())
    return page_document([document(row, names) for row in rows], after)


@blp.route("/leads/<lead_id:public_id>/notes")
class LeadNotes(MethodView):
    @blp.doc(operationId="listLeadNotes")
    @requires("leads:read")
    @blp.arguments(PageQuery(), location="query")
    @blp.response(200, page_of(NoteSchema))
    def get(self, params, public_id):
        """List a lead's notes, newest first"""
        lead = visible_lead_or_404(public_id)
        return prebuilt_response(history_page("notes", Note, lead, params, note_document))

    @blp.doc(operationId="addLeadNote")
    @requires("notes:write")
    @blp.arguments(NoteCreateSchema())
    @blp.response(201, NoteDocumentSchema)
    def post(self, data, public_id):
        """Add a note to a lead"""
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        note = pipeline.add_note(lead, data["body"], actor(), refs)
        return prebuilt_response({"data": note_document(note, ActorNames([note], refs))}, 201)


@blp.route("/notes/<note_id:public_id>")
class LeadNote(MethodView):
    @blp.doc(operationId="updateNote")
    @requires("notes:write")
    @blp.arguments(NoteCreateSchema())
    @blp.response(200, NoteDocumentSchema)
    @blp.alt_response(409, response="CONFLICT")
    def patch(self, data, public_id):
        """Change a note's body (its author or an admin)"""
        refs = request_refs()
        note = pipeline.edit_note(visible_note_or_404(public_id), data["body"], actor(), refs)
        return prebuilt_response({"data": note_document(note, ActorNames([note], refs))})

    @blp.doc(operationId="deleteNote")
    @requires("notes:write")
    @blp.response(204)
    @blp.alt_response(409, response="CONFLICT")
    def delete(self, public_id):
        """Delete a note (its author or an admin)"""
        pipeline.delete_note(visible_note_or_404(public_id), actor(), request_refs())
        return Response(status=204)


@blp.route("/leads/<lead_id:public_id>/activities")
class LeadActivities(MethodView):
    @blp.doc(operationId="logLeadActivity")
    @requires("activities:write")
    @blp.arguments(ActivityCreateSchema())
    @blp.response(201, ActivityLoggedSchema)
    def post(self, data, public_id):
        """Log a call, e-mail, meeting or message (moves last_activity_at and the score)"""
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        lead, activity = pipeline.log_activity(lead, data["kind"], data["summary"], data.get("occurred_at"),
                                               actor(), refs)
        return prebuilt_response({"data": activity_document(activity, ActorNames([activity], refs)),
                              "lead": lead_document(lead, refs)}, 201)


@blp.route("/leads/<lead_id:public_id>/transitions")
class LeadTransitions(MethodView):
    @blp.doc(operationId="listLeadTransitions")
    @requires("leads:read")
    @blp.arguments(PageQuery(), location="query")
    @blp.response(200, page_of(TransitionSchema))
    def get(self, params, public_id):
        """List a lead's stage moves, oldest first"""
        lead = visible_lead_or_404(public_id)
        return prebuilt_response(history_page("transitions", Transition, lead, params, transition_document))


@blp.route("/leads/<lead_id:public_id>/audit")
class LeadAudit(MethodView):
    @blp.doc(operationId="listLeadAuditEntries")
    @requires("audit:read")
    @blp.arguments(PageQuery(), location="query")
    @blp.response(200, page_of(AuditEntrySchema))
    def get(self, params, public_id):
        """List a lead's audit entries, oldest first"""
        lead = visible_lead_or_404(public_id)
        return prebuilt_response(history_page("audit", AuditEntry, lead, params, audit_document))
