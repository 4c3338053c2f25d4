"""Conditional requests on a lead and the lock every write takes: the lead's ETag, the If-Match
check a write makes on the locked row, and the ETag header each lead answer documents."""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Callable

import peewee as pw

from .auth import lead_bound, lead_not_found
from .db import for_update, statement
from .history import Actor
from .models import Lead
from .problems import Conflict, NotFound, PreconditionFailed

ETAG_HEADER = {"ETag": {"description": "Send it back in If-Match to update only this version.",
                        "schema": {"type": "string"}}}


def etag(lead: Any) -> str:
    """A strong validator that changes with every write to the lead (its version)."""
    return '"' + hashlib.sha256(f"{lead.public_id}:{lead.version}".encode()).hexdigest()[:20] + '"'


def lock_lead(lead: Lead, actor: Actor) -> Lead:
    """The lead's current row, locked until the transaction ends, if the actor still sees it: a
    reassignment between the view's lookup and this lock must not let a write through. An erased
    lead is 409: nothing writes to it any more."""
    column, bound = lead_bound(actor.caller) if actor.caller is not None else (None, None)
    if actor.caller is not None and bound is None:
        raise NotFound(f"No lead {lead.public_id}.")
    params = [lead.id] if column is None else [lead.id, bound]
    current = next(iter(Lead.raw(statement(_locking(column.name if column else None)), *params)), None)
    if current is None:   # out of scope, or merged meanwhile (a tombstone is in no scope)
        raise lead_not_found(lead.public_id, actor.caller) if actor.caller is not None else NotFound(
            f"No lead {lead.public_id}.")
    if current.erased_at is not None:
        raise Conflict(f"Lead {lead.public_id} was erased: its history stays, but it can no longer change.")
    return current


@functools.cache
def _locking(scope: str | None) -> Callable[[], pw.Query]:
    """What builds the statement that locks a lead by id (and the value of its scope column, if
    named): written once per kind of database and scope (db.statement), since every write of a
    lead runs it and peewee's building of it costs more than the database's work."""
    def build() -> pw.Query:
        query = Lead.select().where(Lead.id == 0)
        if scope is not None:
            # A scope never holds a merged lead (a tombstone): auth.lead_scope's condition.
            query = query.where(getattr(Lead, scope) == 0, Lead.merged_into.is_null())
        return for_update(query)
    return build


def check_if_match(record: Any, if_match: str | None, what: str = "lead") -> None:
    """412 unless the If-Match header sent (if any) names the locked record's current ETag, or *
    (a lead; a task, which has a version too)."""
    if if_match is None:
        return
    candidates = {tag.strip().removeprefix("W/") for tag in if_match.split(",")}
    if "*" not in candidates and etag(record) not in candidates:
        raise PreconditionFailed(f"The {what} changed since you read it (If-Match does not match its ETag).")
