"""The /api/v1/leads blueprint: views only. The work is in pipeline.py and listing.py."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from apispec import BasePlugin
from flask import g, request
from flask.views import MethodView

from . import pipeline
from .auth import caller, requires, visible_lead_or_404, visible_leads
from .config import settings
from .documents import (ActorNames, LeadBatchResultSchema, LeadCreatedSchema, LeadDuplicateSchema, LeadListMetaSchema,
                        LeadSchema, Refs, StatusMoveResultSchema, activity_document, etag, prebuilt_response,
                        lead_document, note_document, request_refs, transition_document)
from .extensions import Blueprint, check_storable
from .listing import LeadListQuery, lead_page, page_document, unknown_filters
from .models import Activity, Note
from .problems import Forbidden, Problem, flatten_messages
from .schemas import (LeadBatchSchema, LeadCreateSchema, LeadPatchSchema, LeadReadQuery, StatusMoveSchema, one,
                      page_of)

blp = Blueprint("leads", __name__, url_prefix="/api/v1/leads",
                description="Leads in the caller's scope: list, create, read, update, move through the pipeline.")

TIMELINE_LIMIT = 100
ETAG_HEADER = {"ETag": {"description": "Send it back in If-Match to update only this version.",
                        "schema": {"type": "string"}}}
IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string"},
            "description": "The ETag you read; 412 if the lead changed since."}
IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False, "schema": {"type": "string"},
                 "description": "The ETag you read; 304 if the lead has not changed since (not with include)."}


class ConditionalRequestsPlugin(BasePlugin):
    """Documents If-Match on every operation that can answer 412 and If-None-Match on every one
    that can answer 304: each status is that header's answer."""

    def operation_helper(self, path=None, operations=None, **kwargs) -> None:
        for operation in (operations or {}).values():
            statuses = {str(status) for status in operation.get("responses", {})}
            for status, header in (("412", IF_MATCH), ("304", IF_NONE_MATCH)):
                if status in statuses:
                    operation.setdefault("parameters", []).append(header)


def actor() -> pipeline.Actor:
    """The actor of the current API request (leads and their timeline)."""
    return pipeline.actor_for(caller(), g.request_id)


def lead_url(public_id: str) -> str:
    """The lead's path, under whatever prefix the app is mounted at: what url_for gives for
    LeadResource, without its URL building (2% of a create). A public id needs no quoting."""
    return f"{request.script_root}{blp.url_prefix}/{public_id}"


def create_answer(data: dict[str, Any], who: pipeline.Actor, refs: Refs) -> tuple[pipeline.Created, dict[str, Any]]:
    """Create one lead from a checked body: what was done, and the body POST /api/v1/leads answers
    (a batch item's result holds the same)."""
    created = pipeline.create_lead(data, who, refs)
    if not created.duplicate:
        return created, {"data": lead_document(created.lead, refs), "duplicate": False}
    # A token that may only create learns which lead the contact is, never what it holds.
    document = (lead_document(created.lead, refs) if "leads:read" in caller().abilities
                else {"id": created.lead.public_id})
    body = {"data": document, "duplicate": True, "matched_on": created.matched_on}
    if created.updated_fields is not None:
        body["updated_fields"] = created.updated_fields
    return created, body


@blp.route("")
class Leads(MethodView):
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

    @requires("leads:create")
    @blp.arguments(LeadCreateSchema())
    @blp.response(201, LeadCreatedSchema, description="Created; Location points at the new lead.",
                  headers={"Location": {"schema": {"type": "string"}}, **ETAG_HEADER})
    @blp.alt_response(200, schema=LeadDuplicateSchema, success=True,
                      description="A lead with this phone or e-mail exists: nothing was created.")
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    def post(self, data):
        """Create a lead, or find (and optionally update) the duplicate it matches"""
        created, body = create_answer(data, actor(), request_refs())
        if created.duplicate:
            return prebuilt_response(body, 200)
        return prebuilt_response(body, 201, {"Location": lead_url(created.lead.public_id),
                                         "ETag": etag(created.lead)})


@blp.route("/batch")
class LeadsBatch(MethodView):
    commits_in_steps = True   # each item commits alone, with an Idempotency-Key too (idempotency.py)

    @requires("leads:create")
    @blp.arguments(LeadBatchSchema())
    @blp.response(200, LeadBatchResultSchema, description="One result per item, in the order sent.")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    def post(self, batch):
        """Create up to 100 leads, each as POST /api/v1/leads would, in its own transaction"""
        # The request is parsed, authenticated, rate limited and given its reference data once;
        # each item then takes the single create's path.
        who, refs, schema = actor(), request_refs(), LeadCreateSchema()
        results, meta = [], {"created": 0, "duplicates": 0, "failed": 0}
        for index, item in enumerate(batch["leads"]):
            result = {"index": index, "status": 422, "duplicate": False, "lead": None, "errors": None}
            try:
                check_storable(item)
                created, body = create_answer(schema.load(item), who, refs)
            except ma.ValidationError as exc:
                result["errors"] = flatten_messages(exc.messages)
            except Problem as exc:
                if exc.status >= 500:   # the database, not the item: the request fails
                    raise
                result.update(status=exc.status, errors=exc.errors or {"body": [exc.detail or exc.code]})
            else:
                result.update(status=200 if created.duplicate else 201, duplicate=created.duplicate, lead=body["data"])
                result.update({key: body[key] for key in ("matched_on", "updated_fields") if key in body})
            meta["duplicates" if result["status"] == 200 else "created" if result["status"] == 201 else "failed"] += 1
            results.append(result)
        return prebuilt_response({"data": results, "meta": meta})


@blp.route("/<lead_id:public_id>")
class LeadResource(MethodView):
    @requires("leads:read")
    @blp.arguments(LeadReadQuery(), location="query")
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(304, description="Not modified: the lead still has the ETag sent in If-None-Match.",
                      headers=ETAG_HEADER, success=True)
    @blp.alt_response(404, response="NOT_FOUND")
    def get(self, query, public_id):
        """Read a lead, optionally with its activities and notes"""
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
        return prebuilt_response({"data": document}, headers={"ETag": tag})

    @requires("leads:update")
    @blp.arguments(LeadPatchSchema())
    @blp.response(200, one(LeadSchema), headers=ETAG_HEADER)
    @blp.alt_response(404, response="NOT_FOUND")
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    def patch(self, changes, public_id):
        """Update the fields sent (owner needs leads:assign)"""
        if "owner" in changes and "leads:assign" not in caller().abilities:
            raise Forbidden("Changing the owner needs the leads:assign ability.")
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        lead = pipeline.update_lead(lead, changes, actor(), refs, if_match=request.headers.get("If-Match")).lead
        return prebuilt_response({"data": lead_document(lead, refs)}, headers={"ETag": etag(lead)})


@blp.route("/<lead_id:public_id>/status")
class LeadStatus(MethodView):
    @requires("leads:status")
    @blp.arguments(StatusMoveSchema())
    @blp.response(200, StatusMoveResultSchema, headers=ETAG_HEADER)
    @blp.alt_response(404, response="NOT_FOUND")
    @blp.alt_response(409, response="CONFLICT")
    @blp.alt_response(412, response="PRECONDITION_FAILED")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    def post(self, move, public_id):
        """Move a lead to another pipeline status"""
        lead = visible_lead_or_404(public_id)
        refs = request_refs()
        lead, transition = pipeline.move_status(lead, move["status"], move.get("note"), actor(), refs,
                                                if_match=request.headers.get("If-Match"), reason=move.get("reason"))
        return prebuilt_response({"data": lead_document(lead, refs),
                              "transition": transition_document(transition, ActorNames([transition], refs))},
                             headers={"ETag": etag(lead)})
