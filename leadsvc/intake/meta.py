"""Meta (Facebook and Instagram) lead ads: Meta verifies the endpoint with a GET (hub.mode,
hub.verify_token, hub.challenge), then posts leadgen notifications signed with the app secret
(X-Hub-Signature-256). A notification names a lead (leadgen_id) without its answers: each is
stored as a pending intake, and the lead is fetched from the Graph API (its `field_data`),
which `lead` maps."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Mapping

from .mapping import Mapped, attribution, external_id, form_answers, same_key

SIGNATURE_HEADER = "X-Hub-Signature-256"
CONTACT_FIELDS = {"full_name": "full_name", "first_name": "first_name", "last_name": "last_name",
                  "phone_number": "phone", "email": "email"}
MAX_CHALLENGE = 256   # characters of hub.challenge echoed back (Meta sends a short number)


def challenge(args: Mapping[str, str], key: str) -> str | None:
    """The challenge to answer a subscription check that carries the connector's key, else None."""
    token, answer = args.get("hub.verify_token"), args.get("hub.challenge")
    if args.get("hub.mode") != "subscribe" or token is None or answer is None:
        return None
    if not same_key(token, key):
        return None
    if not 0 < len(answer) <= MAX_CHALLENGE or not answer.isprintable():
        return None
    return answer


def signed(body: bytes, header: str | None, app_secret: str) -> bool:
    """Whether X-Hub-Signature-256 is the HMAC-SHA256 of the raw body with the app secret."""
    if not header or not header.startswith("sha256=") or not app_secret:
        return False
    expected = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(header.removeprefix("sha256=").lower().encode(), expected.encode())


def leadgen_changes(payload: Any) -> list[tuple[str, dict[str, Any]]]:
    """(leadgen_id, change entry) of each leadgen change in a notification; the rest is not ours."""
    found = []
    entries = payload.get("entry") if isinstance(payload, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        changes = entry.get("changes") if isinstance(entry, dict) else None
        for change in changes if isinstance(changes, list) else []:
            if not isinstance(change, dict) or change.get("field") != "leadgen" or not isinstance(change.get("value"), dict):
                continue
            if (leadgen_id := external_id(change["value"].get("leadgen_id"))) is not None:
                found.append((leadgen_id, change))
    return found


def answers(lead_data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, first value) of each field_data answer of a Graph API lead."""
    rows = lead_data.get("field_data")
    found = []
    for row in rows if isinstance(rows, list) else []:
        values = row.get("values") if isinstance(row, dict) else None
        if isinstance(values, list) and values and isinstance(row.get("name"), str):
            found.append((row["name"], values[0]))
    return found


def fetched(payload: Any) -> bool:
    """Whether an intake's payload is the Graph API's lead (with its answers) rather than the
    notification's change that named it (a fetch not done, or given up)."""
    return isinstance(payload, dict) and isinstance(payload.get("field_data"), list)


def lead(lead_data: Mapping[str, Any], settings: Mapping[str, Any]) -> Mapped:
    """A lead as the Graph API answers GET /{leadgen_id}?fields=field_data,... (its `id` is the leadgen id)."""
    return Mapped(external_id(lead_data.get("id")), form_answers(answers(lead_data), CONTACT_FIELDS, settings),
                  attribution(campaign_id=lead_data.get("campaign_id"), adgroup_id=lead_data.get("adset_id"),
                              ad_id=lead_data.get("ad_id"), form_id=lead_data.get("form_id")))
