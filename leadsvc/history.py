"""Who makes a change (the actor) and the rows that record it: activities on the lead's timeline
and audit entries, each written in the transaction of the change it records."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import peewee as pw
from flask import g

from .auth import Caller, caller, in_lead_scope, member_scope, require
from .db import insert_rows
from .fields import rfc3339
from .models import Activity, AuditEntry, Connector, Form, Lead, Member, Token, Workspace, new_public_id, utcnow


@dataclass(frozen=True)
class Actor:
    """Who makes a change, and the API caller whose scope bounds the leads and members it may
    touch (None: a web form, a connector or an import, which act on the whole workspace)."""

    workspace: Workspace
    token: Token | None = None
    member: Member | None = None
    form: Form | None = None
    request_id: str | None = None
    caller: Caller | None = None
    connector: Connector | None = None
    via: str | None = None   # how a system actor comes in: "import" (a CSV file), "cli"

    def columns(self) -> dict[str, Any]:
        """The actor columns of a history row (transition, activity, note, audit entry)."""
        return {"actor_token": self.token, "actor_member": self.member, "actor_form": self.form,
                "actor_connector": self.connector}

    @property
    def channel(self) -> str:
        """How the leads it creates came in (models.CHANNELS): a connector's kind, a web form,
        a CSV import, else the API."""
        if self.connector is not None:
            return self.connector.kind
        if self.form is not None:
            return "form"
        return "import" if self.via == "import" else "api"

    @property
    def member_scope(self) -> pw.Expression | None:
        return None if self.caller is None else member_scope(self.caller)

    def sees(self, lead: Lead) -> bool:
        """Whether the lead, as just read, is in the actor's scope."""
        return self.caller is None or in_lead_scope(self.caller, lead)

    def require(self, ability: str, why: str) -> None:
        """403, as @requires answers, unless the actor holds the ability (forms and imports act
        for the workspace); `why` says what needs it."""
        if self.caller is not None:
            require(ability, why, self.caller)


def actor_for(who: Caller, request_id: str | None) -> Actor:
    """The actor of an API request: its token and member, limited to the caller's scope."""
    return Actor(workspace=who.workspace, token=who.token, member=who.member, request_id=request_id, caller=who)


def actor() -> Actor:
    """The actor of the current API request (after @requires)."""
    return actor_for(caller(), g.request_id)


# --- the rows that record a change ---------------------------------------------------------

def plain(value: Any) -> Any:
    """A value as it appears in audit entries and activities: JSON, public ids, no internal ids."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, pw.Model):
        return value.public_id
    return value


def record_activity(lead: Lead, actor: Actor, kind: str, summary: str, data: dict | None = None,
                    at: datetime | None = None) -> Activity:
    """Add an entry to the lead's timeline (in the caller's transaction); the entry, as written
    (without its internal id: insert_rows writes it as peewee would, for less than a create costs)."""
    row = {**activity_row(lead, actor, kind, summary, data, at), "public_id": new_public_id("act_")}
    insert_rows(Activity, [row])
    return Activity(**row)


def activity_row(lead: Lead, actor: Actor, kind: str, summary: str, data: dict | None = None,
                 at: datetime | None = None) -> dict[str, Any]:
    """An activity row's columns, for one insert or several at once."""
    now = utcnow()
    return {"workspace": lead.workspace_id, "lead": lead.id, "kind": kind, "summary": summary, "data": data or {},
            "occurred_at": at or now, "created_at": now, **actor.columns()}


def record_audit(lead: Lead, actor: Actor, action: str, changes: dict[str, Any]) -> None:
    """Add an audit entry with the old and new value of each change (in the caller's transaction)."""
    insert_rows(AuditEntry, [{"workspace": lead.workspace_id, "lead": lead.id, "action": action, "changes": changes,
                              "request_id": actor.request_id, "at": utcnow(), **actor.columns()}])
