"""JustDial: its lead API calls a URL with the connector's key in its path, by GET or POST, with
the lead as query or form fields; `dncmobile=1` says the mobile is on India's do-not-call list."""

from __future__ import annotations

from typing import Any, Mapping

from .mapping import Mapped, contact, custom_fields, external_id, text


def lead(values: Mapping[str, Any], settings: Mapping[str, Any]) -> Mapped:
    """JustDial's fields (leadid, name, mobile, email, city, area, category, date, time, dncmobile) as a lead."""
    fields = contact({"full_name": values.get("name"), "phone": values.get("mobile"), "email": values.get("email")})
    if custom := custom_fields(values.items(), settings.get("custom_fields") or {}):
        fields["custom_fields"] = custom
    return Mapped(external_id(values.get("leadid")), fields, do_not_contact=text(values.get("dncmobile")) == "1")
