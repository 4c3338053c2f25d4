"""Changes to many leads at once, run as jobs (jobs.py): a member's deactivation (its open leads
reassigned), bulk assign / move / add_task over a filter or ids, and a CSV import by API.

The request checks everything it can and fixes the job's items (the leads, the CSV rows) in one
transaction, so bad input changes nothing; each item then takes the single change's path
(pipeline.update_lead / route_again / move_status, followups.create_task, pipeline.create_lead),
with its rules, audit entry and events, as the job's creator.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any, Mapping

import marshmallow as ma
from flask import request
from flask.views import MethodView

from . import followups, jobs, pipeline
from .auth import Caller, caller, require, requires, revoke_tokens, visible_leads
from .config import settings
from .csv_import import ImportFileError, RowError, check_header, is_blank, read_row
from .db import for_update, transaction
from .documents import JobSchema, one, prebuilt_response
from .extensions import Blueprint
from .fields import PublicId
from .history import Actor, actor
from .listing import LeadFilterQuery, filter_leads
from .models import Job, JobItem, Lead, Member, Token, public_id_pattern, public_id_regex
from .problems import PROBLEM_MIMETYPE, Conflict, NotFound, UnsupportedMediaType, ValidationFailed, flatten_messages
from .refs import Refs, request_refs
from .schemas import ON_DUPLICATE, LeadCreateSchema, TaskCreateSchema

MAX_LEADS = 10_000   # a bulk change's leads at most
ID_BYTES = 48        # a lead id in a JSON list at most: quotes, comma and space included
ROUTING = "routing"
MEMBER_ID = public_id_pattern("mem_")
# The ability each bulk action needs: the single change's (a PATCH of owner needs both).
ACTION_ABILITIES = {"assign": ("leads:update", "leads:assign"), "move": ("leads:status",), "add_task": ("tasks:write",)}
# The list's filters by their names inside the brackets (status for filter[status]), and q.
FILTER_KEYS = {(field.data_key or name).removeprefix("filter[").removesuffix("]"): field.data_key or name
               for name, field in LeadFilterQuery().fields.items()}

blp = Blueprint("bulk", __name__, url_prefix="/api/v1",
                description="Changes to many leads at once (deactivation, bulk changes, imports), run as jobs.")


# --- what each job does to one item -----------------------------------------------------------

def _lead(item: JobItem) -> Lead:
    """The item's lead, as read with the batch (each change locks it again)."""
    if item.lead is None:
        raise NotFound("The lead no longer exists.")
    return item.lead


def _assign(lead: Lead, to: str, actor: Actor, refs: Refs) -> None:
    """To a member (mem_...), as a PATCH of owner; or to whom the rules choose ("routing")."""
    if to == ROUTING:
        pipeline.route_again(lead, actor, refs)
    else:
        pipeline.update_lead(lead, {"owner": to}, actor, refs)


@jobs.work("deactivate")
def _reassign_from_deactivated(job: Job, item: JobItem, actor: Actor, refs: Refs) -> None:
    lead = _lead(item)
    if lead.owner_id != job.params["member_id"]:
        return   # reassigned meanwhile by someone else: nothing left to do
    _assign(lead, job.params["reassign_to"], actor, refs)


@jobs.work("assign")
def _bulk_assign(job: Job, item: JobItem, actor: Actor, refs: Refs) -> None:
    params = job.params["params"]
    _assign(_lead(item), ROUTING if params.get("routing") else params["owner"], actor, refs)


@jobs.work("move")
def _bulk_move(job: Job, item: JobItem, actor: Actor, refs: Refs) -> None:
    params = job.params["params"]
    pipeline.move_status(_lead(item), params["status"], None, actor, refs, reason=params.get("reason"))


@jobs.work("add_task")
def _bulk_add_task(job: Job, item: JobItem, actor: Actor, refs: Refs) -> None:
    followups.create_task(_lead(item), TaskCreateSchema().load(job.params["params"]), actor, refs)


@jobs.work("import")
def _import_row(job: Job, item: JobItem, actor: Actor, refs: Refs) -> None:
    cells = item.data["cells"]
    if is_blank(cells):
        return   # a blank line, or a row an erasure blanked
    try:
        data = read_row(job.params["columns"], cells, refs, LeadCreateSchema(), job.params["on_duplicate"])
    except RowError as exc:
        raise ValidationFailed(errors=exc.messages) from None
    # A duplicate is no failure: running the same file again creates nothing twice.
    pipeline.create_lead(data, dataclasses.replace(actor, via="import"), refs)


# --- deactivation -----------------------------------------------------------------------------

class DeactivationSchema(ma.Schema):
    reassign_to = ma.fields.String(required=True, metadata={
        "description": "An active member (mem_...) who takes the open leads, or `routing`: the distribution rules "
                       "choose for each lead, as for a new one.",
        "pattern": f"^(routing|{public_id_regex('mem_')})$"})

    @ma.validates("reassign_to")
    def _member_or_routing(self, value, **kwargs):
        if value != ROUTING and not MEMBER_ID.match(value):
            raise ma.ValidationError("Name a member (mem_...) or routing.")


def deactivate(public_id: str, reassign_to: str, actor: Actor, refs: Refs) -> Job:
    """In one transaction: the member becomes inactive (routing passes it over, assignments refuse
    it), its tokens are revoked, and a job that reassigns its open leads is queued."""
    who = actor.caller
    with transaction():
        member = for_update(Member.select().where((Member.public_id == public_id)
                                                  & (Member.workspace == who.workspace.id))).first()
        if member is None:
            raise NotFound(f"No member {public_id}.")
        if member.id == who.member.id:
            raise Conflict("You cannot deactivate yourself: another admin can.")
        if not member.active:
            raise Conflict(f"Member {public_id} is already deactivated.")
        if reassign_to != ROUTING:
            target = pipeline.assignable_member(reassign_to, actor, field="reassign_to")
            if target.id == member.id:
                raise ValidationFailed.field("reassign_to", "The member being deactivated cannot take its own leads.")
        Member.update(active=False).where(Member.id == member.id).execute()
        revoke_tokens(Token.member == member.id)
        open_statuses = [status.id for status in refs.statuses.values() if status.kind == "open"] or [0]
        # Not a merged lead (a tombstone, which only its survivor stands for) nor an erased one.
        leads = (Lead.select(Lead.id).where((Lead.workspace == who.workspace.id) & (Lead.owner == member.id)
                                            & Lead.status.in_(open_statuses) & Lead.merged_into.is_null()
                                            & Lead.erased_at.is_null()).order_by(Lead.id).tuples())
        return jobs.start("deactivate", who, actor.request_id, {"member_id": member.id, "reassign_to": reassign_to},
                          ({"lead": lead_id} for lead_id, in leads))


# --- bulk changes -----------------------------------------------------------------------------

class AssignParamsSchema(ma.Schema):
    owner = PublicId("mem_")
    routing = ma.fields.Boolean(validate=ma.validate.Equal(True, error="Send routing: true, or an owner."))

    @ma.validates_schema
    def _one_of(self, data, **kwargs):
        if ("owner" in data) == ("routing" in data):
            raise ma.ValidationError("Send either owner or routing: true.", "owner")


class MoveParamsSchema(ma.Schema):
    status = PublicId("st_", required=True)
    reason = PublicId("lr_", metadata={"description": "Why the leads were lost, for a move to a lost status."})


PARAMS_SCHEMAS: dict[str, type[ma.Schema]] = {"assign": AssignParamsSchema, "move": MoveParamsSchema,
                                              "add_task": TaskCreateSchema}


class BulkSchema(ma.Schema):
    action = ma.fields.String(required=True, validate=ma.validate.OneOf(list(ACTION_ABILITIES)))
    filter = ma.fields.Dict(keys=ma.fields.String(), metadata={
        "description": "The lead list's filters by their names inside the brackets, with the list's values, and q: "
                       "{\"status\": \"st_...\", \"created_at\": \"last_7_days\", \"q\": \"rao\"}. An unknown key "
                       "is 422."})
    ids = ma.fields.List(PublicId("ld_"), validate=ma.validate.Length(min=1, max=MAX_LEADS))
    params = ma.fields.Dict(required=True, metadata={
        "description": "assign: {\"owner\": \"mem_...\"} or {\"routing\": true}; move: {\"status\": \"st_...\", "
                       "\"reason\": \"lr_...\"}; add_task: a task body, as POST /leads/{id}/tasks takes it."})
    dry_run = ma.fields.Boolean(load_default=False, metadata={"description": "true: only count the leads."})

    @ma.validates_schema
    def _filter_or_ids(self, data, **kwargs):
        if ("filter" in data) == ("ids" in data):
            raise ma.ValidationError("Send either filter or ids.", "filter")


class BulkCountSchema(ma.Schema):
    count = ma.fields.Integer(required=True, metadata={"description": "The leads the change would touch."})


def parse_filter(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The list's filters from {name: value}, parsed as the list parses its query; 422 on
    `filter.<name>` for an unknown name or a bad value."""
    unknown = {f"filter.{name}": ["Unknown field."] for name in raw if name not in FILTER_KEYS}
    if unknown:
        raise ValidationFailed(errors=unknown)
    query = {FILTER_KEYS[name]: ",".join(map(str, value)) if isinstance(value, list) else value
             for name, value in raw.items()}
    try:
        return LeadFilterQuery().load(query)
    except ma.ValidationError as exc:
        names = {data_key: name for name, data_key in FILTER_KEYS.items()}
        raise ValidationFailed(errors={f"filter.{names.get(key, key)}": messages for key, messages
                                       in flatten_messages(exc.messages).items()}) from None


def check_params(action: str, raw: Mapping[str, Any], refs: Refs) -> dict[str, Any]:
    """The action's params as sent, checked now (422 on `params.<field>`) so that a job never
    starts with params every lead would refuse."""
    try:
        PARAMS_SCHEMAS[action]().load(raw)
        if action == "move":
            pipeline.move_target(raw["status"], raw.get("reason"), refs)
        elif action == "assign" and "owner" in raw:
            pipeline.assignable_member(raw["owner"], actor())
    except ma.ValidationError as exc:
        raise ValidationFailed(errors={f"params.{key}": messages for key, messages
                                       in flatten_messages(exc.messages).items()}) from None
    except ValidationFailed as exc:
        raise ValidationFailed(errors={f"params.{key}": messages for key, messages
                                       in (exc.errors or {}).items()}) from None
    return dict(raw)


def bulk_leads(body: Mapping[str, Any], refs: Refs) -> list[int]:
    """The leads a bulk change touches, in the caller's scope, by internal id in id order; 422 over
    MAX_LEADS, or for ids that are not leads the caller sees."""
    if "ids" in body:
        wanted = set(body["ids"])
        found = dict(visible_leads(Lead.public_id, Lead.id).where(Lead.public_id.in_(list(wanted))).tuples())
        missing = sorted(wanted - set(found))
        if missing:
            raise ValidationFailed.field("ids", f"No lead you can see has these ids: {', '.join(missing[:10])}"
                                                + (" and more." if len(missing) > 10 else "."))
        return sorted(found.values())
    query = filter_leads(visible_leads(Lead.id), parse_filter(body["filter"]), refs, settings())
    ids = [lead_id for lead_id, in query.order_by(Lead.id).limit(MAX_LEADS + 1).tuples()]
    if len(ids) > MAX_LEADS:
        raise ValidationFailed.field("filter", f"The filter matches more than {MAX_LEADS:,} leads; narrow it.")
    return ids


# --- imports ----------------------------------------------------------------------------------

class ImportQuery(ma.Schema):
    on_duplicate = ma.fields.String(load_default="ignore", validate=ma.validate.OneOf(ON_DUPLICATE), metadata={
        "description": "A row whose phone or e-mail matches a lead: `ignore` it, `update` the lead, or `fill_empty` "
                       "its empty fields (both need leads:update), as `leadsvc import --on-duplicate`."})


def import_rows(body: bytes, on_duplicate: str, who: Caller, request_id: str | None, refs: Refs) -> Job:
    """A job that creates a lead from each row of the CSV file; a file that cannot be imported
    (not UTF-8, a wrong header) is 422 at once and creates nothing."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValidationFailed.field("body", "The file is not UTF-8 text; save it as \"CSV UTF-8\".") from None
    if "\x00" in text:   # no database stores it in text
        raise ValidationFailed.field("body", "The file holds NUL characters: it is not a CSV text file.")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        columns = check_header(next(reader, None), refs)
        rows = [{"data": {"row": row, "cells": cells}} for row, cells in enumerate(reader, start=2)]
    except ImportFileError as exc:
        raise ValidationFailed.field("body", str(exc)) from None
    except csv.Error as exc:
        raise ValidationFailed.field("body", f"The file is not CSV: {exc}.") from None
    return jobs.start("import", who, request_id, {"columns": columns, "on_duplicate": on_duplicate}, rows)


# --- views ------------------------------------------------------------------------------------

ACCEPTED = "Accepted: the job runs in batches; GET /api/v1/jobs/{id} shows its progress."


@blp.route("/members/<member_id:public_id>/deactivate")
class MemberDeactivation(MethodView):
    @blp.doc(operationId="deactivateMember")
    @requires("members:manage")
    @blp.arguments(DeactivationSchema())
    @blp.response(202, one(JobSchema), description=ACCEPTED)
    @blp.alt_response(404, response="NOT_FOUND")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data, public_id):
        """Deactivate a member: its tokens stop working, and its open leads are reassigned by a job"""
        return {"data": deactivate(public_id, data["reassign_to"], actor(), request_refs())}


@blp.route("/leads/bulk")
class LeadsBulk(MethodView):
    # Room for MAX_LEADS ids besides what any body may hold (extensions.body_limits).
    max_body = staticmethod(lambda api: api["max_body_bytes"] + MAX_LEADS * ID_BYTES)

    @blp.doc(operationId="changeLeadsInBulk", description="Requires the ability of the action: assign needs "
                                                          "`leads:update` and `leads:assign`, move `leads:status`, "
                                                          "add_task `tasks:write`.")
    @requires()
    @blp.arguments(BulkSchema())
    @blp.response(202, one(JobSchema), description=ACCEPTED)
    @blp.alt_response(200, schema=one(BulkCountSchema), success=True, description="dry_run: how many leads.")
    @blp.alt_response(403, response="FORBIDDEN")
    def post(self, body):
        """Assign, move or add a task to many leads: a filter's or the ids sent, at most 10,000"""
        for ability in ACTION_ABILITIES[body["action"]]:
            require(ability)
        refs = request_refs()
        params = check_params(body["action"], body["params"], refs)
        leads = bulk_leads(body, refs)
        if body["dry_run"]:
            return prebuilt_response({"data": {"count": len(leads)}})
        return {"data": jobs.start(body["action"], caller(), actor().request_id, {"params": params},
                                   ({"lead": lead_id} for lead_id in leads))}


@blp.route("/imports")
class Imports(MethodView):
    max_body = staticmethod(lambda api: api["max_import_bytes"])   # the CSV file (extensions.body_limits)

    @blp.doc(operationId="importLeads", requestBody={
        "required": True, "description": "The CSV file of `leadsvc import`: its header names the columns.",
        "content": {"text/csv": {"schema": {"type": "string"}}}}, responses={"413": {
            "description": "The file is larger than api.max_import_bytes; nothing was created.",
            "content": {PROBLEM_MIMETYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}})
    @requires("leads:create")
    @blp.arguments(ImportQuery(), location="query")
    @blp.response(202, one(JobSchema), description=ACCEPTED + " Its errors are the rows that failed.")
    @blp.alt_response(415, response="UNSUPPORTED_MEDIA_TYPE")
    def post(self, query):
        """Import leads from a CSV file, each row as POST /api/v1/leads would create it"""
        if request.mimetype != "text/csv":
            raise UnsupportedMediaType("Send the file with Content-Type: text/csv.")
        if query["on_duplicate"] != "ignore":
            require("leads:update", f"on_duplicate={query['on_duplicate']} needs the leads:update ability.")
        return {"data": import_rows(request.get_data(cache=True), query["on_duplicate"], caller(),
                                    actor().request_id, request_refs())}
