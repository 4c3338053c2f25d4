"""The endpoints senders call: /api/v1/intake/<conn_id> and /api/v1/intake/<conn_id>/<key>.

No bearer token: each connector checks its sender the way the sender documents (its module in
this package), in constant time. Anything that does not pass, an unknown connector id and a
malformed one included, gets the same 403 and stores nothing, so a stranger learns nothing about
which connectors exist. Counted per connector (rate_limits.intake, applied in create_app), not
per client address: a sender's requests come from anywhere in its own network, and one
connector hammered leaves the others their budget.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import marshmallow as ma
import peewee as pw
from flask import Response, g, request
from flask.views import MethodView

from .. import connectors
from ..auth import REQUEST_WORKSPACE_COLUMNS
from ..config import settings
from ..db import read_rows, statement
from ..documents import one
from ..events import SecretKeyMissing
from ..extensions import Blueprint, check_storable, parse_json_body
from ..models import Connector, Workspace, public_id_pattern
from ..problems import PROBLEM_MIMETYPE, Forbidden, ValidationFailed
from . import SENDERS, generic, google_ads, meta, queue, take
from .mapping import same_key

log = logging.getLogger("leadsvc.intake")

blp = Blueprint("intake", __name__, url_prefix="/api/v1/intake",
                description="Where lead sources post (no token): each connector checks its sender as the sender "
                            "documents, and answers 200 once the payload is stored.")

CONNECTOR_ID = public_id_pattern("conn_")
REFUSED = ("This endpoint does not take the request: the connector id, its key or the signature is not right "
           "(or the connector does not take this method).")
# JSON values one payload may hold: a lead form has tens of answers; what is far beyond is refused,
# not stored.
MAX_VALUES = 2000
# Senders whose key is in the path, and those that send to the bare connector URL.
KEY_IN_PATH = ("indiamart", "justdial")


class IntakeReceiptBodySchema(ma.Schema):
    intakes = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The intake ids the payload was stored as (one per lead it names; none for a Meta "
                       "notification without a leadgen change). Whatever became of the lead is not told."})


RECEIPT = one(IntakeReceiptBodySchema)
ANY_JSON = {"content": {"application/json": {"schema": {"type": "object"}}}}
SENDER_FIELDS = {"content": {
    "application/x-www-form-urlencoded": {"schema": {"type": "object", "additionalProperties": {"type": "string"}}},
    "application/json": {"schema": {"type": "object"}}}}
TOO_LARGE = {"413": {"description": "The body is larger than api.max_body_bytes; nothing was stored.",
                     "content": {PROBLEM_MIMETYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}}}
CHALLENGE = {"200": {"description": "Meta's subscription check passed: the challenge, as sent.",
                     "content": {"text/plain": {"schema": {"type": "string"}}}}}


def refuse() -> Forbidden:
    return Forbidden(REFUSED)


def find(conn_id: str) -> Connector:
    """The connector with this id and its workspace, or the refusal (an id of the wrong form is not
    looked up). In one query whose statement is written once, as a caller's token is read."""
    rows = read_rows(FOUND_COLUMNS, statement(_find_query), [conn_id]) if CONNECTOR_ID.fullmatch(conn_id) else []
    if not rows:
        raise refuse()
    values = iter(rows[0])
    connector = Connector(**{column.name: next(values) for column in CONNECTOR_COLUMNS})
    connector.workspace = Workspace(**{column.name: next(values) for column in REQUEST_WORKSPACE_COLUMNS})
    return connector


CONNECTOR_COLUMNS = (Connector.id, Connector.public_id, Connector.workspace, Connector.name, Connector.kind,
                     Connector.source, Connector.key_salt, Connector.settings, Connector.last_error,
                     Connector.last_error_at, Connector.pulled_until, Connector.pull_after, Connector.created_at)
FOUND_COLUMNS = CONNECTOR_COLUMNS + REQUEST_WORKSPACE_COLUMNS


def _find_query() -> pw.Query:
    return Connector.select(*FOUND_COLUMNS).join(Workspace).where(Connector.public_id == "")


def key_of(connector: Connector) -> str:
    try:
        return connectors.key_of(connector, settings()["webhooks"]["secret_key"])
    except SecretKeyMissing as exc:
        log.warning("connector %s refused a request: %s", connector.public_id, exc)
        raise refuse() from None


def app_secret(connector: Connector) -> str:
    """Meta's app secret, from the environment variable the setup file names."""
    name = (connector.settings or {}).get("app_secret_env") or ""
    value = os.environ.get(name, "")
    if not value:
        problem = f"The environment variable {name} (app_secret_env) is not set: Meta's notifications cannot be checked."
        log.warning("connector %s: %s", connector.public_id, problem)
        if connector.last_error != problem:
            Connector.update(last_error=problem).where(Connector.id == connector.id).execute()
    return value


def checked(payload: Any) -> Any:
    """A verified sender's payload, if it is a JSON object the database can store and not absurdly big."""
    if not isinstance(payload, dict):
        raise ValidationFailed.field("body", "The request body must be a JSON object.")
    check_storable(payload)
    values, pending = 0, [payload]
    while pending:
        value = pending.pop()
        values += 1
        if values > MAX_VALUES:
            raise ValidationFailed.field("body", f"The payload holds more than {MAX_VALUES} values; no lead has "
                                                 "that many. Nothing was stored.")
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return payload


def unverified_json() -> Any:
    """The body as JSON before its sender is known (Google's key is inside it): unreadable is refused."""
    try:
        return parse_json_body(request.get_data(cache=True))
    except ValidationFailed:
        raise refuse() from None


def receipt(*intakes) -> dict[str, Any]:
    return {"data": {"intakes": [row.public_id for row in intakes]}}


def taken(connector: Connector, payload: Any) -> dict[str, Any]:
    mapped = SENDERS[connector.kind].lead(payload, connector.settings or {})
    return receipt(take(connector, payload, mapped, settings(), request_id=g.get("request_id")))


@blp.route("/<conn_id>")
class Intake(MethodView):
    @blp.doc(operationId="verifyIntake", security=[], responses=CHALLENGE, parameters=[
        {"in": "query", "name": name, "schema": {"type": "string"}} for name in
        ("hub.mode", "hub.verify_token", "hub.challenge")])
    @blp.alt_response(403, response="FORBIDDEN")
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def get(self, conn_id):
        """Meta's subscription check: the challenge back when hub.verify_token is the connector's key"""
        connector = find(conn_id)
        if connector.kind != "meta":
            raise refuse()
        answer = meta.challenge(request.args, key_of(connector))
        if answer is None:
            raise refuse()
        return Response(answer, mimetype="text/plain")

    @blp.doc(operationId="sendIntake", security=[], requestBody={"required": True, **ANY_JSON}, responses=TOO_LARGE,
             description=(
        "Google Ads (google_key in the body), Meta (X-Hub-Signature-256), generic (Standard Webhooks "
        "signature, or Authorization: Bearer <key>)."))
    @blp.response(200, RECEIPT, description="Stored (a retry of a payload stored before answers its intake).")
    @blp.alt_response(403, response="FORBIDDEN")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def post(self, conn_id):
        """Take a lead from Google Ads, a Meta notification, or a generic sender"""
        connector = find(conn_id)
        body = request.get_data(cache=True)
        if connector.kind == "google_ads":
            payload = unverified_json()
            if not google_ads.verified(payload, key_of(connector)):
                raise refuse()
            return taken(connector, checked(google_ads.without_key(payload)))
        if connector.kind == "meta":
            if not meta.signed(body, request.headers.get(meta.SIGNATURE_HEADER), app_secret(connector)):
                raise refuse()
            payload = checked(parse_json_body(body))
            return receipt(*(queue(connector, leadgen_id, change) for leadgen_id, change in meta.leadgen_changes(payload)))
        if connector.kind == "generic":
            if not generic.verified(body, request.headers, key_of(connector)):
                raise refuse()
            return taken(connector, checked(parse_json_body(body)))
        raise refuse()   # IndiaMART and JustDial send to the URL with the key


@blp.route("/<conn_id>/<key>")
class IntakeWithKey(MethodView):
    @blp.doc(operationId="sendIntakeByQuery", security=[], description="JustDial, with the lead in the query.")
    @blp.response(200, RECEIPT, description="Stored (a retry of a lead stored before answers its intake).")
    @blp.alt_response(403, response="FORBIDDEN")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def get(self, conn_id, key):
        """Take a JustDial lead sent as query fields"""
        connector = self.checked_connector(conn_id, key)
        if connector.kind != "justdial":
            raise refuse()
        return taken(connector, checked(request.args.to_dict()))

    @blp.doc(operationId="sendIntakeWithKey", security=[], requestBody={"required": True, **SENDER_FIELDS},
             responses=TOO_LARGE, description="IndiaMART's push (JSON with RESPONSE) or JustDial (form fields).")
    @blp.response(200, RECEIPT, description="Stored (a retry of a lead stored before answers its intake).")
    @blp.alt_response(403, response="FORBIDDEN")
    @blp.alt_response(422, response="UNPROCESSABLE_ENTITY")
    @blp.alt_response(429, response="TOO_MANY_REQUESTS")
    def post(self, conn_id, key):
        """Take an IndiaMART push or a JustDial lead"""
        connector = self.checked_connector(conn_id, key)
        if connector.kind == "indiamart":
            return taken(connector, checked(parse_json_body(request.get_data(cache=True))))
        if request.mimetype == "application/json":
            return taken(connector, checked(parse_json_body(request.get_data(cache=True))))
        return taken(connector, checked({**request.args.to_dict(), **request.form.to_dict()}))

    @staticmethod
    def checked_connector(conn_id: str, key: str) -> Connector:
        """The connector, if the key in the path is its key (compared in constant time)."""
        connector = find(conn_id)
        if connector.kind not in KEY_IN_PATH or not same_key(key, key_of(connector)):
            raise refuse()
        return connector
