"""What every sender's mapping gives (Mapped) and the rules they share: a full name split at its
last space, text cut to what a lead holds, a sender's columns mapped to custom fields, and
RFC 6901 JSON pointers (the generic connector's map)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..fields import is_blank, trim
from ..schemas import NAME_LENGTH

# The attribution keys a lead keeps (DESIGN section 19); a sender's id is `external_id`.
ATTRIBUTION_KEYS = ("campaign_id", "adgroup_id", "ad_id", "form_id", "gclid", "fbclid", "utm_source", "utm_medium",
                    "utm_campaign", "utm_term", "utm_content")
ATTRIBUTION_LENGTH = 200   # characters of one attribution value (lead.campaign's width)
EXTERNAL_ID_LENGTH = 200   # intake.external_id's width
CONTACT_TARGETS = ("first_name", "last_name", "full_name", "phone", "email")


def same_key(sent: str, key: str) -> bool:
    """Whether a sender sent the connector's key, compared in constant time (text from JSON may
    hold lone surrogates, which plain UTF-8 cannot encode)."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), key.encode())


@dataclass
class Mapped:
    """A sender's payload read as a lead: the sender's id, a create body's fields
    (LeadCreateSchema: names, phone, email, estimated_value, custom_fields), attribution, a note
    for the lead (IndiaMART's message), and what the sender says of it. What maps to no field
    stays in the intake's payload."""

    external_id: str | None
    fields: dict[str, Any] = field(default_factory=dict)
    attribution: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    test: bool = False             # Google's is_test: recorded, answered, no lead
    do_not_contact: bool = False   # JustDial's dncmobile


def text(value: Any, limit: int | None = None) -> str | None:
    """A sender's value as trimmed text (numbers too), cut to `limit` characters; None when blank."""
    if value is None or isinstance(value, (dict, list)) or isinstance(value, bool):
        return None
    value = trim(str(value))
    if is_blank(value):
        return None
    return value[:limit] if limit else value


def external_id(value: Any) -> str | None:
    return text(value, EXTERNAL_ID_LENGTH)


def attribution(**values: Any) -> dict[str, str]:
    """The attribution keys given a value (ids as text, each cut to its column's width)."""
    return {key: value for key, raw in values.items() if (value := text(raw, ATTRIBUTION_LENGTH)) is not None}


def contact(values: Mapping[str, Any]) -> dict[str, Any]:
    """Create-body fields from first_name, last_name, full_name, phone and email values: a full
    name splits at its last space (the last word is the last name, the rest the first name) and
    fills only the names not given on their own; names are cut to what a lead holds."""
    names: dict[str, str] = {}
    full = text(values.get("full_name"))
    if full is not None:
        first, _, last = full.rpartition(" ")
        names = {"first_name": trim(first), "last_name": last} if first else {"first_name": last}
    for name in ("first_name", "last_name"):
        if (value := text(values.get(name))) is not None:
            names[name] = value
    fields: dict[str, Any] = {name: value[:NAME_LENGTH] for name, value in names.items() if value}
    for name in ("phone", "email"):
        if (value := text(values.get(name))) is not None:
            fields[name] = value
    return fields


def custom_fields(columns: Iterable[tuple[str, Any]], wanted: Mapping[str, str]) -> dict[str, Any]:
    """The values of the sender's columns that the connector maps (column id -> custom field)."""
    found = {}
    for column, value in columns:
        name = wanted.get(column)
        if name is not None and (value := text(value)) is not None:
            found[name] = value
    return found


def form_answers(answers: list[tuple[str, Any]], contact_names: Mapping[str, str],
                 settings: Mapping[str, Any]) -> dict[str, Any]:
    """Create-body fields from a lead form's answers, (question, value): the questions
    `contact_names` names fill the contact, those the connector's custom_fields maps its custom
    fields (Google's columns, Meta's field_data)."""
    fields = contact({contact_names[name]: value for name, value in answers if name in contact_names})
    if custom := custom_fields(answers, settings.get("custom_fields") or {}):
        fields["custom_fields"] = custom
    return fields


# --- RFC 6901 ---------------------------------------------------------------------------------

class PointerError(ValueError):
    """Not a JSON pointer."""


def parse_pointer(pointer: str) -> list[str]:
    """A JSON pointer's reference tokens ("" is the whole document)."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PointerError("A JSON pointer is empty or starts with /, as /contact/phone.")
    tokens = pointer[1:].split("/")
    for token in tokens:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise PointerError("In a JSON pointer, ~ is written ~0 and / inside a name ~1.")
    return [token.replace("~1", "/").replace("~0", "~") for token in tokens]


def resolve(document: Any, pointer: str) -> Any:
    """The value a JSON pointer names in the document, or None where it names nothing."""
    value = document
    for token in parse_pointer(pointer):
        if isinstance(value, dict):
            value = value.get(token)
        elif isinstance(value, list) and token.isdigit() and (token == "0" or not token.startswith("0")):
            index = int(token)
            value = value[index] if index < len(value) else None
        else:
            return None
        if value is None:
            return None
    return value
