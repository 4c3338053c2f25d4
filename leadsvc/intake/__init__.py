"""Intake: what connectors receive, and the one way a payload becomes a lead (DESIGN section 19).

Each sender has a module that checks it the way the sender documents and maps its payload
(`lead(payload, settings) -> Mapped`): google_ads, meta, indiamart, justdial, generic. Then every
payload goes the same way:

- `take(connector, payload, mapped)` stores the intake and sends its lead through
  pipeline.create_lead, with the connector as the actor and its source, in one transaction, so
  that an intake exists with its outcome exactly when its lead (or duplicate submission) does. A
  sender's id is unique per connector (the index intake_connector_id_external_id): a retry, or
  the same payload sent twice at once, finds or waits for the first and creates nothing.
- `queue(connector, external_id, payload)` stores a `pending` intake due now, and nothing more:
  Meta's notifications name a lead whose answers are fetched from the Graph API later; the fetch
  then calls `settle(intake, connector, payload, mapped)` with the Graph API's lead as the payload.
- `retry` settles a rejected intake again, mapped by the connector's current setup.

A payload that fails validation (a landline, no contact) is kept as `rejected` with the errors a
422 would give; the sender was answered 200 all the same. The payloads of created and duplicate
intakes are cut after PAYLOAD_KEPT by a timer per connector (`cut_payloads`), whose every run
costs what is due: it reads the partial index intake_payload_kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping

import marshmallow as ma
import peewee as pw

from .. import clock, events, pipeline
from ..custom_fields import form_value
from ..db import database, for_update, insert_rows, read_rows, statement, transaction
from ..fields import phones_of
from ..history import Actor
from ..models import Connector, Intake, utcnow
from ..problems import Conflict, Problem
from ..refs import Refs, cached_refs
from ..schemas import LeadCreateSchema
from . import generic, google_ads, indiamart, justdial, meta
from .mapping import Mapped

# kind -> the module that checks and maps its sender
SENDERS = {"google_ads": google_ads, "meta": meta, "indiamart": indiamart, "justdial": justdial, "generic": generic}

PAYLOAD_KEPT = timedelta(days=30)   # created and duplicate intakes keep their raw payload this long
CUT = "intake.cut_payloads"         # the timer kind, one per connector
CUT_BATCH = 500                     # payloads one run cuts; a bigger backlog runs again at once
CUT_EVERY = timedelta(days=1)       # the longest a connector's timer sleeps (a retried intake is cut by then)
ERROR_LENGTH = 500                  # connector.last_error's width
LEAD_FIELDS = LeadCreateSchema()    # what a sender's payload maps to, read as an API create's body


def take(connector: Connector, payload: Any, mapped: Mapped, settings: Mapping[str, Any], *,
         request_id: str | None = None) -> Intake:
    """Store a payload as an intake and send its lead through the create path, once per sender id:
    the intake already stored under this id when there is one (nothing else happens then)."""
    if mapped.external_id is not None and (seen := _stored(connector, mapped.external_id)) is not None:
        return seen
    now = utcnow()
    row = Intake(workspace=connector.workspace_id, connector=connector.id, external_id=mapped.external_id,
                 payload=payload, received_at=now, updated_at=now)
    try:
        with transaction(turn=connector.workspace_id):   # a create's turn (db.transaction)
            _settle(row, connector, mapped, settings, request_id)   # the intake is inserted with its outcome
    except pw.IntegrityError:
        # A concurrent delivery of the same id committed first (on PostgreSQL this one's insert
        # waited for it): this one's lead, if any, rolled back with it, and it answers the first's intake.
        if mapped.external_id is None or (seen := _stored(connector, mapped.external_id)) is None:
            raise
        return seen
    return row


def queue(connector: Connector, external_id: str, payload: Any) -> Intake:
    """Store a pending intake due now (a fetch picks it up), once per sender id."""
    if (seen := _stored(connector, external_id)) is not None:
        return seen
    now = utcnow()
    row = Intake(workspace=connector.workspace_id, connector=connector.id, external_id=external_id,
                 outcome="pending", payload=payload, received_at=now, updated_at=now, next_attempt_at=now)
    try:
        with transaction():
            row.save(force_insert=True)
            database.after_commit(events.jobs_committed)   # this process's deliverer fetches it at once
    except pw.IntegrityError:
        if (seen := _stored(connector, external_id)) is None:
            raise
        return seen
    return row


def _queue_again(row: Intake) -> Intake:
    """A rejected intake whose fetch gave up, pending and due now with a fresh schedule."""
    with transaction():
        current = for_update(Intake.select().where(Intake.id == row.id)).first()
        if current is None or current.outcome != "rejected":
            raise Conflict(f"Intake {row.public_id} was settled already: only a pending or rejected one runs again.")
        now = utcnow()
        current.outcome, current.errors, current.failures = "pending", None, 0
        current.next_attempt_at = current.updated_at = now
        current.save()
        database.after_commit(events.jobs_committed)
    return current


def settle(row: Intake, connector: Connector, payload: Any, mapped: Mapped, settings: Mapping[str, Any]) -> Intake:
    """Send a stored intake's lead through the create path (a fetched pending one, a retried
    rejected one), keeping `payload` as what it stands for; one transaction, the intake locked."""
    with transaction(turn=connector.workspace_id):   # a create's turn (db.transaction)
        current = for_update(Intake.select().where(Intake.id == row.id)).first()
        if current is None or current.outcome not in ("pending", "rejected"):
            raise Conflict(f"Intake {row.public_id} was settled already: only a pending or rejected one runs again.")
        current.payload, current.next_attempt_at = payload, None
        _settle(current, connector, mapped, settings, None)
    return current


def retry(row: Intake, connector: Connector, settings: Mapping[str, Any]) -> Intake:
    """Run a rejected intake again, mapped by the connector's current setup (409 for any other)."""
    if row.outcome != "rejected":
        raise Conflict(f"Intake {row.public_id} is {row.outcome}: only a rejected intake can be retried.")
    if row.payload is None:
        raise Conflict(f"Intake {row.public_id} no longer holds its payload.")
    if connector.kind == "meta" and not meta.fetched(row.payload):   # its fetch gave up: fetch it again
        return _queue_again(row)
    mapped = SENDERS[connector.kind].lead(row.payload, connector.settings or {})
    return settle(row, connector, row.payload, mapped, settings)


# --- one intake's way through ----------------------------------------------------------------

def _stored(connector: Connector, external_id: str) -> Intake | None:
    """The intake stored under this sender id (its id, public id and outcome), if any: asked
    before every payload, so its statement is written once (db.statement)."""
    rows = read_rows([Intake.id, Intake.public_id, Intake.outcome], statement(_stored_query),
                     [connector.id, external_id])
    return Intake(id=rows[0].id, public_id=rows[0].public_id, outcome=rows[0].outcome) if rows else None


def _stored_query() -> pw.Query:
    return (Intake.select(Intake.id, Intake.public_id, Intake.outcome)
            .where((Intake.connector == 0) & (Intake.external_id == "")))


def _settle(row: Intake, connector: Connector, mapped: Mapped, settings: Mapping[str, Any],
            request_id: str | None) -> None:
    """Create the intake's lead (or its duplicate submission) and record the outcome on the intake
    and the connector's health, in the caller's transaction."""
    workspace = connector.workspace   # read with the connector where the sender's request found it
    refs = cached_refs(workspace, settings)
    actor = Actor(workspace=workspace, connector=connector, request_id=request_id)
    now = utcnow()
    row.errors, row.updated_at = None, now
    if mapped.test:
        row.outcome = "test"
    else:
        try:
            with transaction():   # a savepoint: a refusal half-way leaves nothing of the lead behind
                created = _create(mapped, connector, actor, refs)
        except (ma.ValidationError, Problem) as exc:
            if isinstance(exc, Problem) and exc.status >= 500:   # the database, not the payload: the sender retries
                raise
            row.outcome, row.errors = "rejected", pipeline.item_failure(exc, "payload")[1]
        else:
            row.outcome, row.lead = ("duplicate" if created.duplicate else "created"), created.lead
    if row.id is None:   # a new payload's intake, inserted with its outcome
        insert_rows(Intake, [{"workspace": row.workspace_id, "connector": row.connector_id, "public_id": row.public_id,
                              "external_id": row.external_id, "outcome": row.outcome, "lead": row.lead_id,
                              "errors": row.errors, "payload": row.payload, "received_at": row.received_at,
                              "updated_at": row.updated_at, "attempts": 0, "failures": 0}])
    else:                # a stored one (fetched, retried): what changed
        row.save()
    problem = None if row.outcome != "rejected" else _summary(row)
    if problem is not None or connector.last_error is not None:   # most payloads leave the health as it was
        Connector.update(last_error=problem, last_error_at=now if problem else None).where(
            Connector.id == connector.id).execute()


def _create(mapped: Mapped, connector: Connector, actor: Actor, refs: Refs) -> pipeline.Created:
    """The create path with what the sender sent, the connector's source, attribution and consent."""
    fields = dict(mapped.fields)
    if "custom_fields" in fields:   # senders send text: read as each field's type, as a form's are
        fields["custom_fields"] = {name: form_value(value, refs.custom_fields.get(name)) if isinstance(value, str)
                                   else value for name, value in fields["custom_fields"].items()}
    with phones_of(actor.workspace):
        data = LEAD_FIELDS.load(fields)
    source = refs.sources.get(connector.source_id)
    data["source"] = source.public_id if source else None
    data["attribution"] = {**mapped.attribution, "external_id": mapped.external_id}
    data["do_not_contact"] = mapped.do_not_contact
    if notice := (connector.settings or {}).get("notice_version"):
        data["consent"] = {"purpose": connector.name, "notice_version": notice}
    created = pipeline.create_lead(data, actor, refs)
    lead = created.lead
    if created.duplicate and mapped.do_not_contact and not lead.do_not_contact:
        lead = pipeline.update_lead(lead, {"do_not_contact": True}, actor, refs).lead
    if mapped.note:
        pipeline.add_note(lead, mapped.note, actor, refs)
    return pipeline.Created(lead, created.duplicate, created.matched_on)


def _summary(row: Intake) -> str:
    problems = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in (row.errors or {}).items())
    return f"Intake {row.public_id} was rejected: {problems}"[:ERROR_LENGTH]


# --- cutting old payloads --------------------------------------------------------------------

def kept_payloads() -> pw.Expression:
    """The intakes whose payload the cut takes in time: intake_payload_kept's condition, with its
    outcomes written as literals, as the index has them (SQLite uses a partial index only for a
    query whose terms are the index's own, and a bound parameter is not)."""
    return Intake.payload.is_null(False) & Intake.outcome.in_(pw.SQL("('created', 'duplicate')"))


def arm_cut(connector: Connector, at: datetime) -> None:
    """Arm the connector's cut for `at`, in the caller's transaction (setup arms a new
    connector's; each run arms the next, at most CUT_EVERY ahead, so nothing waits long past its
    time: a payload stored after a run is due no sooner than PAYLOAD_KEPT later)."""
    clock.arm(CUT, connector.id, connector.workspace_id, at)


@clock.timer(CUT)
def cut_payloads(connector_id: int, due: datetime, now: datetime, settings: dict) -> None:
    """Cut the raw payloads of the connector's created and duplicate intakes older than
    PAYLOAD_KEPT, a batch at a time, and arm the next cut for when the oldest kept one comes due."""
    connector = Connector.get_or_none(Connector.id == connector_id)
    if connector is None:
        return
    cutoff = now - PAYLOAD_KEPT
    kept = Intake.select(Intake.id).where((Intake.connector == connector_id) & kept_payloads())
    due_ids = [row_id for (row_id,) in kept.where(Intake.received_at <= cutoff).order_by(Intake.received_at)
               .limit(CUT_BATCH).tuples()]
    if due_ids:
        Intake.update(payload=None, updated_at=now).where(Intake.id.in_(due_ids)).execute()
    oldest = kept.select(Intake.received_at).order_by(Intake.received_at).limit(1).scalar()
    at = now + CUT_EVERY if oldest is None else max(now, min(oldest + PAYLOAD_KEPT, now + CUT_EVERY))
    arm_cut(connector, at)


# Registered on import: the Graph API fetch (a kind of Deliverer job) and IndiaMART's pull (a clock
# timer), both of which settle and take intakes through the functions above.
from . import fetch, pull  # noqa: E402,F401
