"""Meta's leads fetched from the Graph API. A notification names a lead (its leadgen_id) without
its answers, and is stored as a pending intake due at once (intake.queue). The Deliverer claims
those as a kind of job beside webhook deliveries (delivery.py: the lease, FOR UPDATE SKIP LOCKED,
the sender pool and its caps, the retry SCHEDULE, outcomes fenced by the attempt), GETs each
lead with the page token of the environment variable its connector names, and settles the
intake through the shared step (intake.settle): created, duplicate or rejected.

A failed fetch (no answer in time, a 5xx, a 4xx such as a bad token, an answer that is not JSON
or too long) is retried on the schedule, and shown as the intake's and the connector's
last_error. When the schedule runs out the intake is `rejected` with the reason, payload kept:
a retry queues the fetch again (intake.retry), so no intake is ever lost.

The Graph API's URL is the operator's setting (connectors.meta_graph_url), not a user's: it is
not held to the public-address rule of webhook URLs (outbound.operator_settings).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import peewee as pw

from .. import intake
from ..db import for_update, is_postgres, read_rows, statement, transaction
from ..delivery import Claimed, Jobs, destination, kind, next_delay
from ..models import Connector, Intake
from ..outbound import Answer
from . import meta

log = logging.getLogger("leadsvc.intake")

# What a fetch asks of a lead: its answers, when it came, and where from (attribution).
GRAPH_FIELDS = "field_data,created_time,ad_id,adset_id,campaign_id,form_id,platform,is_organic"
# Bytes of a Graph API answer read: a lead's answers are a few KiB; anything far longer is refused
# unread, not parsed.
KEPT_ANSWER = 256 * 1024
ERROR_LENGTH = 500   # intake.last_error's and connector.last_error's width


def lead_url(base: str, leadgen_id: str, token: str) -> str:
    """GET {base}/{leadgen_id}?fields=...&access_token=..., the lead's URL at the Graph API."""
    query = urlencode({"fields": GRAPH_FIELDS, "access_token": token})
    return f"{base.rstrip('/')}/{quote(leadgen_id, safe='')}?{query}"


def read_lead(answer: Answer) -> tuple[dict[str, Any] | None, str | None]:
    """The lead a Graph API answer holds, or why it holds none (for people; never the token)."""
    if answer.status is None:
        return None, answer.error or "No answer."
    if not answer.whole:
        return None, f"The Graph API's answer was longer than {KEPT_ANSWER // 1024} KiB, or cut off; it was not read."
    try:
        data = json.loads(answer.body or "")
    except ValueError:
        return None, f"The Graph API answered HTTP {answer.status} with something that is not JSON."
    if answer.status != 200:
        error = data.get("error") if isinstance(data, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return None, f"The Graph API answered HTTP {answer.status}" + (f": {message}" if isinstance(message, str) else ".")
    if not isinstance(data, dict) or not isinstance(data.get("field_data"), list):
        return None, "The Graph API's answer holds no field_data."
    return data, None


DUE_COLUMNS = (Intake.id, Intake.workspace, Intake.next_attempt_at)


def due_fetches() -> pw.Query:
    """Intakes with a fetch scheduled, oldest first (the partial index intake_due holds exactly
    those), for a claim to narrow to the due ones."""
    query = Intake.select(*DUE_COLUMNS).order_by(Intake.next_attempt_at)
    # On PostgreSQL the rows a claim reads are locked, and another process's claim is left to it.
    return query.for_update(skip_locked=True) if is_postgres() else query


def oldest_fetches() -> pw.Query:
    """The oldest intakes due for a fetch (parameters: now, how many)."""
    return due_fetches().where(Intake.next_attempt_at <= datetime.min).limit(1)


@kind
class GraphFetches(Jobs):
    """Pending intakes (Meta's) whose lead is fetched from the Graph API."""

    def __init__(self, deliverer: Any):
        super().__init__(deliverer)
        self.base = deliverer.config["connectors"]["meta_graph_url"]
        self.where = destination(self.base)

    def oldest(self, now, rows):
        found = read_rows(DUE_COLUMNS, statement(oldest_fetches), [Intake.next_attempt_at.db_value(now), rows])
        return [(intake_id, workspace, self.where, due) for intake_id, workspace, due in found]

    def due(self, now, rows, full_workspaces, holding):
        if holding[self.where] >= self.deliverer.settings["per_host"]:
            return []
        query = due_fetches().where((Intake.next_attempt_at <= now) & Intake.workspace.not_in(full_workspaces))
        return [(intake_id, workspace, self.where, due) for intake_id, workspace, due in query.limit(rows).tuples()]

    def lease(self, ids, now, lease_until):
        return list(Intake.update(next_attempt_at=lease_until, attempts=Intake.attempts + 1)
                    .where(Intake.id.in_(ids) & (Intake.next_attempt_at <= now))
                    .returning(Intake.id, Intake.attempts).tuples().execute())

    def load(self, ids):
        return list(Intake.select(Intake, Connector).join(Connector).where(Intake.id.in_(ids)))

    def attempt(self, item: Claimed) -> Answer:
        row, connector = item.job, item.job.connector
        name = (connector.settings or {}).get("page_token_env") or ""
        token = os.environ.get(name, "") if name else ""
        if not token:
            return Answer(error=f"The environment variable {name or '(page_token_env)'} is not set: "
                                "Meta's leads cannot be fetched.")
        return self.deliverer.operator_sender.get(
            lead_url(self.base, row.external_id or "", token),
            {"Accept": "application/json", "User-Agent": self.deliverer.user_agent}, keep=KEPT_ANSWER)

    def record(self, item: Claimed, answer: Answer) -> str | None:
        deliverer = self.deliverer
        now = deliverer.clock()
        lead, problem = read_lead(answer)
        connector = item.job.connector
        with transaction():
            row = for_update(Intake.select().where(
                (Intake.id == item.job.id) & (Intake.attempts == item.attempt)
                & (Intake.next_attempt_at == item.lease_until))).first()
            if row is None:   # settled or deleted meanwhile
                return None
            if lead is not None:
                mapped = meta.lead(lead, connector.settings or {})
                mapped.external_id = row.external_id   # the id the notification named, which the answer repeats
                Intake.update(last_error=None).where(Intake.id == row.id).execute()
                return intake.settle(row, connector, lead, mapped, deliverer.config).outcome
            problem = problem[:ERROR_LENGTH]
            row.failures += 1
            row.last_error, row.updated_at = problem, now
            delay = next_delay(row.failures, answer, deliverer.rng)
            if delay is None:
                row.outcome, row.next_attempt_at = "rejected", None
                row.errors = {"leadgen_id": [f"The lead was not fetched from the Graph API in {row.attempts} "
                                             f"attempts (the last: {problem}) A retry fetches it again."]}
            else:
                row.next_attempt_at = now + timedelta(seconds=delay)
            row.save()
            Connector.update(last_error=f"Lead {row.external_id} not fetched: {problem}"[:ERROR_LENGTH],
                             last_error_at=now).where(Connector.id == connector.id).execute()
        log.warning("connector %s: intake %s, fetch %d failed: %s", connector.public_id, row.public_id, item.attempt,
                    problem)
        return row.outcome

    def name(self, item: Claimed) -> str:
        return f"intake {item.job.public_id}"
