"""Events: what happened to a lead, written in the transaction of the change (a transactional outbox).

Every change path in pipeline.py calls `record` inside its `with transaction():`, so an event
exists exactly when its change committed: a change that rolls back leaves no event, and one
that committed is delivered even if the process dies right after (delivery.py sends what the
table holds). An event gets one delivery row per active webhook subscribed to its type; with
none subscribed, `record` returns without touching the database (the workspace's webhooks are
part of its cached reference data).

Signing secrets are derived, never stored: a webhook keeps a random salt, and its secret is
HMAC-SHA256(webhooks.secret_key, salt). A copy of the database alone cannot sign or verify.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterable

from standardwebhooks import Webhook as Signer

from . import jsoncodec
from .db import KEY_SHARE, database, for_update
from .documents import lead_document
from .fields import rfc3339
from .models import Delivery, Event, Lead, Webhook, utcnow
from .refs import Refs

LEAD_EVENTS = ("lead.created", "lead.updated", "lead.status_changed", "lead.assigned", "lead.duplicate_submitted",
               "lead.note_added", "lead.note_edited", "lead.note_deleted", "lead.activity_logged", "lead.erased",
               # Fired by the clock (lead_timers.py): its response due time passed unanswered; it went stale.
               "lead.response_overdue", "lead.stale",
               # Routing found nobody eligible (DESIGN section 20): the lead was created without an owner.
               "lead.unassigned",
               # A merge (merge.py): data.merged and data.merge; its undo: data.unmerged and data.merge.
               "lead.merged", "lead.unmerged")
# What happens to a lead's follow-ups (data: the task and its lead); task.due and task.overdue are
# fired by the clock, at the task's reminder and due times.
TASK_EVENTS = ("task.created", "task.updated", "task.completed", "task.cancelled", "task.due", "task.overdue")
TEST_EVENT = "webhook.test"
EVENT_TYPES = (*LEAD_EVENTS, *TASK_EVENTS, TEST_EVENT)
ROTATION_OVERLAP = timedelta(hours=24)   # how long the previous secret still signs after a rotation
SECRET_PREFIX = "whsec_"

# Set after a commit that wrote jobs (deliveries, fetches): this process's delivery thread looks
# for them at once, past the workspaces at their cap too.
jobs_written = threading.Event()
# Set with it, and when an attempt ends: the delivery thread looks again at once.
work_waiting = threading.Event()


def jobs_committed() -> None:
    """After a commit that wrote jobs."""
    jobs_written.set()
    work_waiting.set()


class SecretKeyMissing(Exception):
    """webhooks.secret_key is empty: no secret can be made or used."""


def record(refs: Refs, event_type: str, lead: Lead, details: Callable[[], dict[str, Any]] | None = None) -> None:
    """Record an event about a lead in the caller's transaction. `details` adds to `data` beside
    `lead` (the lead as an admin reads it), and is only called when some webhook wants the event."""
    hooks = refs.webhooks_for(event_type)
    if not hooks:
        return
    document = {"id": lead.public_id} if event_type == "lead.erased" else lead_document(lead, refs)
    write(refs.workspace.id, event_type, {"lead": document, **(details() if details else {})}, hooks, lead=lead.id)


def write(workspace_id: int, event_type: str, data: dict[str, Any], hooks: Iterable[int], *,
          lead: int | None = None) -> Event:
    """The event row and a delivery due now for each webhook; the delivery threads wake after the commit."""
    now = utcnow()
    body = jsoncodec.text({"type": event_type, "timestamp": rfc3339(now), "data": data})
    event = Event.create(workspace=workspace_id, lead=lead, type=event_type, body=body, created_at=now)
    # `hooks` come from reference data read before this transaction: a webhook deleted or disabled
    # since gets no delivery. The lock keeps each one found until the commit; one being deleted
    # is waited for and then not found, where a plain read would still see it and its delivery
    # would break the foreign key.
    live = for_update(Webhook.select(Webhook.id).where(Webhook.id.in_(list(hooks)) & Webhook.active)
                      .order_by(Webhook.id), KEY_SHARE)
    rows = [{"webhook": hook, "event": event.id, "next_attempt_at": now, "created_at": now}
            for (hook,) in live.tuples()]
    if rows:
        Delivery.insert_many(rows).execute()
    database.after_commit(jobs_committed)
    return event


def forget(lead: Lead) -> None:
    """Cut an erased lead's earlier events down to its id, in the erasure's transaction: their
    bodies copied the lead's personal data. Deliveries still due send the cut body, and the
    answers kept in the deliveries log go: a receiver may echo what it was sent."""
    for event_id, body in Event.select(Event.id, Event.body).where(Event.lead == lead.id).tuples():
        sent = jsoncodec.decode(body)
        cut = jsoncodec.text({"type": sent["type"], "timestamp": sent["timestamp"],
                              "data": {"lead": {"id": lead.public_id}}})
        Event.update(body=cut).where(Event.id == event_id).execute()
    (Delivery.update(last_response=None)
     .where(Delivery.event.in_(Event.select(Event.id).where(Event.lead == lead.id))).execute())


# --- secrets and signatures ------------------------------------------------------------------

def new_salt() -> str:
    return secrets.token_urlsafe(24)


def derive(label: str, salt: str, secret_key: str, *, needed_by: str = "Webhooks") -> bytes:
    """HMAC-SHA256(secret_key, label NUL salt): what a salt stands for under the configured key.
    Each use has its own label (a webhook's secret, a connector's key), so that a value of one
    never equals a value of another made from the same salt."""
    if not secret_key:
        raise SecretKeyMissing(f"{needed_by} need webhooks.secret_key (32+ random characters) in the configuration.")
    return hmac.new(secret_key.encode(), f"leadsvc {label}\x00{salt}".encode(), hashlib.sha256).digest()


def secret(salt: str, secret_key: str) -> str:
    """The whsec_ secret a webhook's salt stands for under the configured key."""
    return SECRET_PREFIX + base64.b64encode(derive("webhook secret", salt, secret_key)).decode()


def signing_secrets(hook: Webhook, secret_key: str, now: datetime) -> list[str]:
    """The secrets that sign a delivery now: the current one, and the previous for 24 h after a rotation."""
    salts = [hook.secret_salt]
    if hook.previous_salt and hook.previous_expires_at and hook.previous_expires_at > now:
        salts.append(hook.previous_salt)
    return [secret(salt, secret_key) for salt in salts]


def signed_headers(event_id: str, body: str, secrets_: list[str], at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt, signed with its own timestamp by each secret."""
    moment = at.replace(tzinfo=UTC)
    signatures = " ".join(Signer(value).sign(event_id, moment, body) for value in secrets_)
    return {"webhook-id": event_id, "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": signatures}
