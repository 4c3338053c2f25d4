"""The /api/v1/webhooks blueprint and what it does: register, change, rotate, test, and the
deliveries log with replay. Admins only (`webhooks:manage`); the CLI calls the same functions."""

from __future__ import annotations

from typing import Any, Mapping

import marshmallow as ma
from flask import Response, request
from flask.views import MethodView

from . import cursor, delivery, events, outbound
from .auth import caller, requires
from .config import settings
from .db import NO_KEY_UPDATE, database, for_update, transaction
from .documents import one, page_of, whole_page
from .extensions import Blueprint
from .fields import Choices, JsonBoolean, Text, UtcDateTime
from .idempotency import shows_secret
from .listing import page_document
from .models import DELIVERY_STATES, Delivery, Event, Webhook, Workspace, public_id_pattern, utcnow
from .problems import Conflict, NotFound, ValidationFailed
from .schemas import PageQuery, NoQuery

blp = Blueprint("webhooks", __name__, url_prefix="/api/v1/webhooks",
                description="HTTPS endpoints that receive the workspace's events, signed (Standard Webhooks).")

WEBHOOK_ID, DELIVERY_ID = public_id_pattern("wh_"), public_id_pattern("dlv_")
DELIVERIES_ORDER = cursor.Order(Delivery.created_at, Delivery.public_id, descending=True)
MAX_WEBHOOKS = 50   # per workspace: each event is written once per subscribed webhook


# --- what goes in and out --------------------------------------------------------------------

class EventTypes(ma.fields.List):
    def __init__(self, **kwargs):
        super().__init__(ma.fields.String(validate=ma.validate.OneOf([*events.EVENT_TYPES, "*"])),
                         validate=ma.validate.Length(min=1, max=len(events.EVENT_TYPES)), metadata={
                             "description": "Event types, or [\"*\"] for all of them."}, **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        types = list(dict.fromkeys(super()._deserialize(value, attr, data, **kwargs)))
        if "*" in types and len(types) > 1:
            raise ma.ValidationError("Send [\"*\"] alone, or the types you want.")
        return types


class WebhookCreateSchema(ma.Schema):
    url = Text(2048, required=True, metadata={"description": "https:// URL that receives the events."})
    events = EventTypes(required=True)
    description = Text(500, load_default="")


class WebhookPatchSchema(ma.Schema):
    url = Text(2048)
    events = EventTypes()
    description = Text(500)
    active = JsonBoolean(metadata={"description": "true again clears disabled_reason."})


class WebhookSchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    url = ma.fields.String(required=True)
    events = ma.fields.List(ma.fields.String(), required=True)
    description = ma.fields.String(required=True)
    active = ma.fields.Boolean(required=True)
    disabled_reason = ma.fields.String(allow_none=True, required=True)
    created_at = UtcDateTime(required=True)


class WebhookWithSecretSchema(WebhookSchema):
    secret = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "whsec_...: shown this once (null in a replay of this answer)."})


class EventRefSchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    type = ma.fields.String(required=True, metadata={"enum": list(events.EVENT_TYPES)})


class DeliverySchema(ma.Schema):
    id = ma.fields.String(attribute="public_id", required=True)
    event = ma.fields.Nested(EventRefSchema, required=True)
    state = ma.fields.String(required=True, metadata={"enum": list(DELIVERY_STATES)})
    attempts = ma.fields.Integer(required=True)
    last_status = ma.fields.Integer(allow_none=True, required=True)
    last_error = ma.fields.String(allow_none=True, required=True)
    last_response = ma.fields.String(allow_none=True, required=True, metadata={"description": "The first 1 KiB."})
    last_attempt_at = UtcDateTime(allow_none=True, required=True)
    next_attempt_at = UtcDateTime(allow_none=True, required=True)
    duration_ms = ma.fields.Integer(allow_none=True, required=True)
    created_at = UtcDateTime(required=True)


class DeliveriesQuery(PageQuery):
    state = Choices(DELIVERY_STATES, data_key="filter[state]")


# --- what the API and the CLI do -------------------------------------------------------------

def _checked_url(url: str, config: Mapping[str, Any]) -> str:
    try:
        outbound.check_destination(url, config["webhooks"])
    except outbound.Refused as exc:
        raise ValidationFailed.field("url", str(exc)) from None
    return url


def _secret(salt: str, config: Mapping[str, Any]) -> str:
    try:
        return events.secret(salt, config["webhooks"]["secret_key"])
    except events.SecretKeyMissing as exc:
        raise Conflict(str(exc)) from None


def create_webhook(workspace_id: int, data: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[Webhook, str]:
    """A new webhook and its secret (shown once; only the salt it derives from is kept)."""
    url = _checked_url(data["url"], config)
    salt = events.new_salt()
    secret = _secret(salt, config)
    with transaction():
        # The workspace's row is locked before counting: two registrations must not both count one
        # below the cap and pass it together.
        for_update(Workspace.select(Workspace.id).where(Workspace.id == workspace_id), NO_KEY_UPDATE).first()
        if Webhook.select().where(Webhook.workspace == workspace_id).count() >= MAX_WEBHOOKS:
            raise Conflict(f"A workspace has at most {MAX_WEBHOOKS} webhooks; delete one first.")
        hook = Webhook.create(workspace=workspace_id, url=url, events=data["events"],
                              description=data.get("description") or "", secret_salt=salt, created_at=utcnow())
    return hook, secret


def lock_webhook(hook: Webhook) -> Webhook:
    """The webhook's current row, locked until the transaction ends: what the view looked up may
    have been changed (rotated, disabled by the deliverer) or deleted meanwhile. Every write that
    touches a webhook takes this lock first, before its deliveries or its workspace's row, so
    they all take locks in one order. It lets creates go on writing deliveries that refer to it."""
    current = for_update(Webhook.select().where(Webhook.id == hook.id), NO_KEY_UPDATE).first()
    if current is None:
        raise NotFound(f"No webhook {hook.public_id}.")
    return current


def update_webhook(hook: Webhook, changes: Mapping[str, Any], config: Mapping[str, Any]) -> Webhook:
    """Change the fields sent; active false gives up on the scheduled deliveries, true clears the reason."""
    url = _checked_url(changes["url"], config) if "url" in changes else None
    with transaction():
        hook = lock_webhook(hook)
        if url is not None:
            hook.url = url
        for name in ("events", "description"):
            if name in changes:
                setattr(hook, name, changes[name])
        if "active" in changes and changes["active"] != hook.active:
            hook.active = changes["active"]
            if hook.active:
                hook.disabled_reason, hook.failing_since = None, None
            else:
                delivery.give_up(hook.id)
        hook.save()
    return hook


def rotate_secret(hook: Webhook, config: Mapping[str, Any]) -> tuple[Webhook, str]:
    """The webhook with a new secret, and the secret; the previous one signs too for the next 24 hours."""
    salt = events.new_salt()
    secret = _secret(salt, config)
    with transaction():
        hook = lock_webhook(hook)
        hook.secret_salt, hook.previous_salt = salt, hook.secret_salt
        hook.previous_expires_at = utcnow() + events.ROTATION_OVERLAP
        # Only the salts: saving the subscription columns would bump the workspace's refs_version.
        hook.save(only=[Webhook.secret_salt, Webhook.previous_salt, Webhook.previous_expires_at])
    return hook, secret


def delete_webhook(hook: Webhook) -> None:
    """The webhook and its deliveries (the database cascades)."""
    with transaction():
        hook = lock_webhook(hook)
        # The workspace's row (the delete bumps its refs_version) before the delete's own lock,
        # which waits for the creates writing deliveries to this webhook: a create may hold the
        # workspace's row (routing's rotation) while it writes them.
        for_update(Workspace.select(Workspace.id).where(Workspace.id == hook.workspace_id), NO_KEY_UPDATE).first()
        Webhook.delete().where(Webhook.id == hook.id).execute()


def send_test(hook: Webhook) -> Delivery:
    """A webhook.test event for this webhook alone, due at once: its delivery, with the event."""
    with transaction():
        hook = lock_webhook(hook)
        if not hook.active:
            raise Conflict("The webhook is disabled; set active to true first.")
        event = events.write(hook.workspace_id, events.TEST_EVENT,
                             {"webhook": {"id": hook.public_id, "url": hook.url}}, [hook.id])
        row = Delivery.get((Delivery.event == event.id) & (Delivery.webhook == hook.id))
    row.event = event
    return row


def replay(row: Delivery, hook: Webhook) -> Delivery:
    """The delivery again, as its next attempt, due now (its retry schedule starts over), with its event."""
    with transaction():
        if not lock_webhook(hook).active:
            raise Conflict("The webhook is disabled; set active to true first.")
        # Locked, the webhook keeps its deliveries; the delivery went only if it went with it.
        Delivery.update(state="pending", failures=0, next_attempt_at=utcnow()).where(Delivery.id == row.id).execute()
        database.after_commit(events.jobs_committed)
    replayed = Delivery.get_by_id(row.id)
    replayed.event = row.event
    return replayed


def webhook_or_404(workspace_id: int, public_id: str) -> Webhook:
    """The workspace's webhook with this id (an id of the wrong form is not looked up, nor echoed)."""
    if not WEBHOOK_ID.fullmatch(public_id):
        raise NotFound("There is no webhook with this id.")
    hook = Webhook.get_or_none((Webhook.workspace == workspace_id) & (Webhook.public_id == public_id))
    if hook is None:
        raise NotFound(f"No webhook {public_id}.")
    return hook


def delivery_or_404(hook: Webhook, public_id: str) -> tuple[Delivery, Event]:
    if not DELIVERY_ID.fullmatch(public_id):
        raise NotFound("There is no delivery with this id.")
    row = (Delivery.select(Delivery, Event).join(Event)
           .where((Delivery.webhook == hook.id) & (Delivery.public_id == public_id)).first())
    if row is None:
        raise NotFound(f"No delivery {public_id} of webhook {hook.public_id}.")
    return row, row.event


def deliveries_page(hook: Webhook, params: Mapping[str, Any]) -> tuple[list[Delivery], str | None]:
    """A page of the webhook's deliveries (each with its event), newest first."""
    query = Delivery.select(Delivery, Event).join(Event).where(Delivery.webhook == hook.id)
    if params.get("state"):
        query = query.where(Delivery.state.in_(params["state"]))
    binding = cursor.fingerprint("deliveries", hook.public_id, params.get("state"))
    rows, after = cursor.page(query, DELIVERIES_ORDER, params["page_size"], binding, params.get("page_after"))
    return rows, after


# --- views -----------------------------------------------------------------------------------

def _hook(public_id: str) -> Webhook:
    return webhook_or_404(caller().workspace.id, public_id)


@blp.route("")
class Webhooks(MethodView):
    @blp.doc(operationId="listWebhooks")
    @requires("webhooks:manage")
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, page_of(WebhookSchema))
    def get(self):
        """List the workspace's webhooks"""
        hooks = Webhook.select().where(Webhook.workspace == caller().workspace.id).order_by(
            Webhook.created_at, Webhook.public_id)
        return whole_page(hooks)

    @blp.doc(operationId="createWebhook")
    @requires("webhooks:manage")
    @blp.arguments(WebhookCreateSchema())
    @blp.response(201, one(WebhookWithSecretSchema), description="Created; `secret` is shown this once.",
                  headers={"Location": {"schema": {"type": "string"}}})
    @blp.alt_response(409, response="CONFLICT")
    def post(self, data):
        """Register a webhook; its signing secret is shown once"""
        hook, secret = create_webhook(caller().workspace.id, data, settings())
        shows_secret()
        hook.secret = secret
        return {"data": hook}, {"Location": f"{request.script_root}{blp.url_prefix}/{hook.public_id}"}


@blp.route("/<webhook_id:public_id>")
class WebhookResource(MethodView):
    @blp.doc(operationId="getWebhook")
    @requires("webhooks:manage")
    @blp.arguments(NoQuery, location="query", as_kwargs=True)
    @blp.response(200, one(WebhookSchema))
    def get(self, public_id):
        """Read a webhook (never its secret)"""
        return {"data": _hook(public_id)}

    @blp.doc(operationId="updateWebhook")
    @requires("webhooks:manage")
    @blp.arguments(WebhookPatchSchema())
    @blp.response(200, one(WebhookSchema))
    def patch(self, changes, public_id):
        """Change a webhook's URL, events, description or active flag"""
        return {"data": update_webhook(_hook(public_id), changes, settings())}

    @blp.doc(operationId="deleteWebhook")
    @requires("webhooks:manage")
    @blp.response(204)
    def delete(self, public_id):
        """Delete a webhook and its deliveries"""
        delete_webhook(_hook(public_id))
        return Response(status=204)


@blp.route("/<webhook_id:public_id>/rotate-secret")
class WebhookRotation(MethodView):
    @blp.doc(operationId="rotateWebhookSecret")
    @requires("webhooks:manage")
    @blp.response(200, one(WebhookWithSecretSchema), description="The new `secret`, shown this once.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id):
        """Rotate the signing secret (the previous one also signs for 24 hours)"""
        hook, secret = rotate_secret(_hook(public_id), settings())
        shows_secret()
        hook.secret = secret
        return {"data": hook}


@blp.route("/<webhook_id:public_id>/test")
class WebhookTest(MethodView):
    @blp.doc(operationId="testWebhook")
    @requires("webhooks:manage")
    @blp.response(202, one(DeliverySchema), description="The webhook.test delivery, due at once.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id):
        """Send a webhook.test event to this webhook now"""
        return {"data": send_test(_hook(public_id))}


@blp.route("/<webhook_id:public_id>/deliveries")
class WebhookDeliveries(MethodView):
    @blp.doc(operationId="listWebhookDeliveries")
    @requires("webhooks:manage")
    @blp.arguments(DeliveriesQuery(), location="query")
    @blp.response(200, page_of(DeliverySchema))
    def get(self, params, public_id):
        """List a webhook's deliveries, newest first"""
        return page_document(*deliveries_page(_hook(public_id), params))


@blp.route("/<webhook_id:public_id>/deliveries/<delivery_id:delivery_id>/replay")
class DeliveryReplay(MethodView):
    @blp.doc(operationId="replayWebhookDelivery")
    @requires("webhooks:manage")
    @blp.response(202, one(DeliverySchema), description="The delivery, due again at once.")
    @blp.alt_response(409, response="CONFLICT")
    def post(self, public_id, delivery_id):
        """Send a delivery again as its next attempt (same webhook-id, new timestamp)"""
        hook = _hook(public_id)
        row, _ = delivery_or_404(hook, delivery_id)
        return {"data": replay(row, hook)}
