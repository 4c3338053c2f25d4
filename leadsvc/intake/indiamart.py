"""IndiaMART: its push API posts each enquiry as JSON to a URL with the connector's key in its path
(IndiaMART cannot sign), `RESPONSE` holding the enquiry; its CRM listing API, pulled on the
clock, answers a list of the same records. `lead` maps one record."""

from __future__ import annotations

from typing import Any, Mapping

from .mapping import Mapped, contact, custom_fields, external_id, text

NOTE_LENGTH = 5000   # a note's limit (section 4)


def record(payload: Any) -> Mapping[str, Any] | None:
    """The enquiry a push carries (its RESPONSE), or None when it carries none."""
    found = payload.get("RESPONSE") if isinstance(payload, dict) else None
    return found if isinstance(found, dict) else None


def lead(payload: Mapping[str, Any], settings: Mapping[str, Any]) -> Mapped:
    """One IndiaMART enquiry (a push, or a record of the CRM listing) as a lead; its QUERY_MESSAGE
    becomes a note on the lead."""
    enquiry = record(payload) or payload
    fields = contact({"full_name": enquiry.get("SENDER_NAME"), "phone": enquiry.get("SENDER_MOBILE"),
                      "email": enquiry.get("SENDER_EMAIL")})
    if custom := custom_fields(enquiry.items(), settings.get("custom_fields") or {}):
        fields["custom_fields"] = custom
    return Mapped(external_id(enquiry.get("UNIQUE_QUERY_ID")), fields,
                  note=text(enquiry.get("QUERY_MESSAGE"), NOTE_LENGTH))
