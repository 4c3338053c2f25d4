"""The /api/v1/connectors blueprint and what it does: a connector's key, its health, the intakes it
took and their retry (DESIGN section 19). Admins only (`connectors:manage`); setup and the CLI
call the same functions. What senders call is leadsvc/intake.

A connector's key is never stored: like a webhook's secret (events.py) it derives from
`webhooks.secret_key` and a random salt of the connector's, under its own derivation label, so
a copy of the database alone can neither make nor check it, and no key ever equals a webhook's
secret. A generic connector's key is a `whsec_` secret (Standard Webhooks signs with it); the
others are URL-safe, because IndiaMART and JustDial carry theirs in the URL path.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any, Iterable, Mapping

import marshmallow as ma
import peewee as pw
from flask import request
from flask.views import MethodView

from . import cursor, events, intake
from .auth import caller, requires
from .config import settings
from .db import NO_KEY_UPDATE, for_update, transaction
from .documents import RefSchema, one, page_of, whole_page
from .extensions import Blueprint
from .fields import Choices, UtcDateTime
from .idempotency import shows_secret
from .listing import page_document
from .models import CONNECTOR_KINDS, INTAKE_OUTCOMES, Connector, Intake, Lead, public_id_pattern, utcnow
from .problems import Conflict, NotFound
from .refs import request_refs
from .schemas import NoQuery, PageQuery

blp = Blueprint("connectors", __name__, url_prefix="/api/v1/connectors",
                description="Inbound lead feeds (Google Ads, Meta, IndiaMART, JustDial, generic): their health, "
                            "the payloads they took, retries and keys.")

CONNECTOR_ID, INTAKE_ID = public_id_pattern("conn_"), public_id_pattern("in_")
INTAKES_ORDER = cursor.Order(Intake.received_at, Intake.public_id, descending=True)
KEY_LABEL = "connector key"
INTAKE_PATH = "/api/v1/intake/"
WINDOWS = {"24h": timedelta(hours=24), "30d": timedelta(days=30)}


# --- keys ------------------------------------------------------------------------------------

def key_for(kind: str, salt: str, secret_key: str) -> str:
    """The key a connector's salt stands for under the configured secret key."""
    digest = events.derive(KEY_LABEL, salt, secret_key, needed_by="Connectors")
    if kind == "generic":
        return events.SECRET_PREFIX + base64.b64encode(digest).decode()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def key_of(connector: Connector, secret_key: str) -> str:
    return key_for(connector.kind, connector.key_salt, secret_key)


def rotate_key(connector: Connector, secret_key: str) -> tuple[Connector, str]:
    """The connector with a new salt, and the key it stands for; the old key stops at once."""
    salt = events.new_salt()
    try:
        key = key_for(connector.kind, salt, secret_key)
    except events.SecretKeyMissing as exc:
        raise Conflict(str(exc)) from None
    with transaction():
        current = for_update(Connector.select().where(Connector.id == connector.id), NO_KEY_UPDATE).first()
        if current is None:
            raise NotFound(f"No connector {connector.public_id}.")
        current.key_salt = salt
        current.save(only=[Connector.key_salt])
    return current, key


def intake_path(connector: Connector, prefix: str = "") -> str:
    """Where its sender posts (IndiaMART and JustDial add /<key>), under the mount prefix."""
    return f"{prefix}{INTAKE_PATH}{connector.public_id}"


# --- health ----------------------------------------------------------------------------------

def counts(connector_ids: Iterable[int]) -> dict[int, dict[str, dict[str, int]]]:
    """Intakes received in the last 24 hours and 30 days, by outcome, for each connector: one
    GROUP BY over the (connector, outcome, received_at) index, reading the last 30 days only."""
    now = utcnow()
    ids = list(connector_ids)
    found = {cid: {window: dict.fromkeys(INTAKE_OUTCOMES, 0) for window in WINDOWS} for cid in ids}
    if not ids:
        return found
    recent = pw.fn.SUM(pw.Case(None, [(Intake.received_at >= now - WINDOWS["24h"], 1)], 0))
    rows = (Intake.select(Intake.connector, Intake.outcome, pw.fn.COUNT(Intake.id), recent)
            .where(Intake.connector.in_(ids) & (Intake.received_at >= now - WINDOWS["30d"]))
            .group_by(Intake.connector, Intake.outcome).tuples())
    for connector_id, outcome, month, day in rows:
        if outcome in INTAKE_OUTCOMES:
            found[connector_id]["30d"][outcome] = month
            found[connector_id]["24h"][outcome] = int(day or 0)
    return found


def documented(connectors: list[Connector], refs: Any) -> list[Connector]:
    """The connectors with what their documents show beside their columns: source, url, counts."""
    health = counts(c.id for c in connectors)
    for connector in connectors:
        connector.source_ref = refs.sources.get(connector.source_id)
        connector.url = intake_path(connector, request.script_root)
        connector.counts = health[connector.id]
    return connectors


# --- intakes ---------------------------------------------------------------------------------

def intakes_page(connector: Connector, params: Mapping[str, Any]) -> tuple[list[Intake], str | None]:
    """A page of the connector's intakes, newest first, each with its lead's public id."""
    query = (Intake.select(Intake, Lead.id, Lead.public_id).join(Lead, pw.JOIN.LEFT_OUTER)
             .where(Intake.connector == connector.id))
    if params.get("outcome"):
        query = query.where(Intake.outcome.in_(params["outcome"]))
    binding = cursor.fingerprint("intakes", connector.public_id, params.get("outcome"))
    rows, after = cursor.page(query, INTAKES_ORDER, params["page_size"], binding, params.get("page_after"))
    return [with_lead_ref(row) for row in rows], after


def with_lead_ref(row: Intake) -> Intake:
    row.lead_ref = {"id": row.lead.public_id} if row.lead_id else None
    return row


def intake_or_404(connector: Connector, public_id: str) -> Intake:
    if not INTAKE_ID.fullmatch(public_id):
        raise NotFound("There is no intake with this id.")
    row = Intake.get_or_none((Intake.connector == connector.id) & (Intake.public_id == public_id))
    if row is None:
        raise NotFound(f"No intake {public_id} of connector {connector.public_id}.")
    return row


def connector_or_404(workspace_id: int, public_id: str) -> Connector:
    """The workspace's connector with this id (an id of the wrong form is not looked up, nor echoed)."""
    if not CONNECTOR_ID.fullmatch(public_id):
        raise NotFound("There is no connector with this id.")
    connector = Connector.get_or_none((Connector.workspace == workspace_id) & (Connector.public_id == public_id))
    if connector is None:
        raise NotFound(f"No connector {public_id}.")
    return connector


# --- what goes out ---------------------------------------------------------------------------

class OutcomeCountsSchema(ma.Schema):
    created = ma.fields.Integer(required=True)
    duplicate = ma.fields.Integer(required=True)
    rejected = ma.fields.Integer(required=True)
    test = ma.fields.Integer(required=True)
    pending = ma.fields.Integer(required=True)


class HealthCountsSchema(ma.Schema):
    last_24h = ma.fields.Nested(OutcomeCountsSchema, data_key="24h", attribute="24h", required=True)
    last_30d = ma.fields.Nested(OutcomeCountsSchema, data_key="30d", attribute="30d", required=True)


class ConnectorSchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    name = ma.fields.String(required=True)
    kind = ma.fields.String(required=True, metadata={"enum": list(CONNECTOR_KINDS)})
    source = ma.fields.Nested(RefSchema, attribute="source_ref", allow_none=True, required=True)
    url = ma.fields.String(required=True, metadata={
        "description": "Where the sender posts (under the mount prefix); IndiaMART and JustDial append /<key>."})
    last_received_at = UtcDateTime(allow_none=True, required=True)
    last_error = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "Why the latest payload was not used; null once a later one is."})
    counts = ma.fields.Nested(HealthCountsSchema, required=True, metadata={
        "description": "Intakes received in the last 24 hours and 30 days, by outcome."})


class ConnectorWithKeySchema(ConnectorSchema):
    key = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The new key, shown this once (null in a replay of this answer)."})


class IdRefSchema(ma.Schema):
    id = ma.fields.String(required=True)


class IntakeSchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    received_at = UtcDateTime(required=True)
    external_id = ma.fields.String(allow_none=True, required=True, metadata={"description": "The sender's own id."})
    outcome = ma.fields.String(required=True, metadata={"enum": list(INTAKE_OUTCOMES)})
    lead = ma.fields.Nested(IdRefSchema, attribute="lead_ref", allow_none=True, required=True, metadata={
        "description": "The lead it created, or the one it was a duplicate submission on."})
    errors = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.List(ma.fields.String()), allow_none=True,
                            required=True, metadata={"description": "A rejected intake's problems, as a 422's."})
    payload = ma.fields.Raw(allow_none=True, required=True, metadata={
        "description": "As received; null once cut (30 days after a created or duplicate intake) or erased."})


class IntakesQuery(PageQuery):
    outcome = Choices(INTAKE_OUTCOMES, data_key="filter[outcome]")


# --- views -----------------------------------------------------------------------------------

def _connector(public_id: str) -> Connector:
    return connector_or_404(caller().workspace.id, public_id)


def _one(connector: Connector) -> Connector:
    return documented([connector], request_refs())[0]


@blp.route("")
class Connectors(MethodView):
    @blp.doc(operationId="listConnectors")
    @requires("connectors:manage")
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(ConnectorSchema))
    def get(self):
        """List the workspace's connectors with their health"""
        rows = list(Connector.select().where(Connector.workspace == caller().workspace.id)
                    .order_by(Connector.name, Connector.public_id))
        return whole_page(documented(rows, request_refs()))


@blp.route("/<connector_id:public_id>")
class ConnectorResource(MethodView):
    @blp.doc(operationId="getConnector")
    @requires("connectors:manage")
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, one(ConnectorSchema))
    def get(self, public_id):
        """Read a connector and its health (never its key)"""
        return {"data": _one(_connector(public_id))}


@blp.route("/<connector_id:public_id>/rotate-key")
class ConnectorKeyRotation(MethodView):
    @blp.doc(operationId="rotateConnectorKey")
    @requires("connectors:manage")
    @blp.response(200, one(ConnectorWithKeySchema), description="The new `key`, shown this once; the old one "
                  "stops working at once.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id):
        """Issue a connector's new key (the old one stops at once)"""
        connector, key = rotate_key(_connector(public_id), settings()["webhooks"]["secret_key"])
        shows_secret()
        connector = _one(connector)
        connector.key = key
        return {"data": connector}


@blp.route("/<connector_id:public_id>/intakes")
class ConnectorIntakes(MethodView):
    @blp.doc(operationId="listConnectorIntakes")
    @requires("connectors:manage")
    @blp.arguments(IntakesQuery(), location="query")
    @blp.response(200, page_of(IntakeSchema))
    def get(self, params, public_id):
        """List what a connector received, newest first"""
        return page_document(*intakes_page(_connector(public_id), params))


@blp.route("/<connector_id:public_id>/intakes/<intake_id:intake_id>/retry")
class IntakeRetry(MethodView):
    @blp.doc(operationId="retryConnectorIntake")
    @requires("connectors:manage")
    @blp.response(200, one(IntakeSchema), description="The intake as it is now (created, duplicate, or rejected "
                  "again with its problems).")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id, intake_id):
        """Run a rejected intake through the create path again (after the setup was fixed)"""
        connector = _connector(public_id)
        row = intake.retry(intake_or_404(connector, intake_id), connector, settings())
        return {"data": with_lead_ref(Intake.select(Intake, Lead.id, Lead.public_id).join(Lead, pw.JOIN.LEFT_OUTER)
                                      .where(Intake.id == row.id).get())}
