"""Consent: the three ways a lead's consent record changes. A create records the consent sent
with it, a duplicate submission that consents records a new one, and a withdrawal marks the
latest (or records one) and makes the lead do-not-contact."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping

from . import events
from .conditional import lock_lead
from .db import transaction
from .documents import consent_document
from .history import Actor, plain, record_activity, record_audit
from .models import Consent, Lead, utcnow

if TYPE_CHECKING:
    from .refs import Refs


def new_consent(lead: Lead, given: Mapping[str, Any] | None, actor: Actor, now: datetime) -> Consent | None:
    """The consent record a create sends, not yet saved, shown on the (unsaved) lead as its latest."""
    if not given:
        return None
    consent = Consent(workspace=lead.workspace_id, purpose=given["purpose"], notice_version=given.get("notice_version"),
                      form=actor.form, token=actor.token, connector=actor.connector, given_at=now, ip=given.get("ip"))
    lead.consent = consent_document(consent, _actor_id(actor))
    return consent


def _actor_id(actor: Actor) -> str | None:
    recorder = actor.form or actor.connector or actor.token
    return recorder.public_id if recorder else None


def consent_again(lead: Lead, given: Mapping[str, Any], actor: Actor, refs: Refs) -> Lead:
    """A duplicate submission that consents: a new record becomes the lead's latest (in the caller's
    transaction). It leaves do_not_contact as it is: only a person's change of mind lifts that."""
    current = lock_lead(lead, actor)
    before = current.consent
    consent = new_consent(current, given, actor, utcnow())
    consent.lead = current
    consent.save(force_insert=True)
    current.updated_at, current.version = consent.given_at, current.version + 1
    current.save()
    changes = {"consent": {"old": before["id"] if before else None, "new": consent.public_id}}
    record_audit(current, actor, "consent_given", changes)
    events.record(refs, "lead.updated", current, lambda: {"changes": changes})
    return current


def withdraw_consent(lead: Lead, actor: Actor, refs: Refs) -> Lead:
    """Record the withdrawal of consent (on the latest record, or a new one) and set do_not_contact."""
    with transaction():
        current = lock_lead(lead, actor)
        latest, now = current.consent, utcnow()
        changes: dict[str, dict[str, Any]] = {}
        if latest is None:
            consent = Consent.create(workspace=current.workspace_id, lead=current, form=actor.form, token=actor.token,
                                     connector=actor.connector, withdrawn_at=now)
            current.consent = consent_document(consent, _actor_id(actor))
            changes["consent"] = {"old": None, "new": consent.public_id}
        elif latest["withdrawn_at"] is None:
            Consent.update(withdrawn_at=now).where(Consent.public_id == latest["id"]).execute()
            current.consent = {**latest, "withdrawn_at": plain(now)}
        if current.consent["withdrawn_at"] != (latest or {}).get("withdrawn_at"):
            changes["consent.withdrawn_at"] = {"old": None, "new": current.consent["withdrawn_at"]}
        if not current.do_not_contact:
            current.do_not_contact = True
            changes["do_not_contact"] = {"old": False, "new": True}
        if not changes:
            return current   # withdrawn already: nothing more to record
        current.updated_at, current.version = now, current.version + 1
        current.save()
        record_activity(current, actor, "updated", "Consent withdrawn.", {"fields": sorted(changes)})
        record_audit(current, actor, "consent_withdrawn", changes)
        events.record(refs, "lead.updated", current, lambda: {"changes": changes})
    return current
