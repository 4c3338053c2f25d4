"""Generic connector: any tool posting JSON, signed with Standard Webhooks (the connector's key is
a whsec_ secret) or sent with `Authorization: Bearer <key>` by tools that cannot sign. The setup
file's `map` (RFC 6901 JSON pointers) says where each lead field is, `external_id` where the
sender's id is."""

from __future__ import annotations

from typing import Any, Mapping

from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from ..auth import bearer_secret
from .mapping import ATTRIBUTION_KEYS, CONTACT_TARGETS, Mapped, contact, external_id, resolve, same_key, text

CUSTOM_PREFIX, ATTRIBUTION_PREFIX = "custom_fields.", "attribution."
TARGETS = (*CONTACT_TARGETS, "estimated_value")   # and custom_fields.<name>, attribution.<key>


def verified(body: bytes, headers: Mapping[str, str], key: str) -> bool:
    """Signed by Standard Webhooks with the key, or carrying it as a bearer token."""
    if "webhook-signature" in headers:
        try:
            Verifier(key).verify(body, {name: headers[name] for name in
                                        ("webhook-id", "webhook-timestamp", "webhook-signature") if name in headers})
        except (WebhookVerificationError, ValueError):
            return False
        return True
    sent = bearer_secret(headers.get("Authorization") or "")
    return sent is not None and same_key(sent, key)


def target_problem(target: str) -> str | None:
    """Why a map key is not a lead field the generic connector fills (None: it is one)."""
    if target in TARGETS or (target.startswith(CUSTOM_PREFIX) and len(target) > len(CUSTOM_PREFIX)):
        return None
    if target.startswith(ATTRIBUTION_PREFIX) and target.removeprefix(ATTRIBUTION_PREFIX) in ATTRIBUTION_KEYS:
        return None
    return (f"not a lead field: use {', '.join(TARGETS)}, custom_fields.<name> or attribution.<key> "
            f"({', '.join(ATTRIBUTION_KEYS)})")


def estimated_value(value: Any) -> Any:
    """A number, or text that reads as one; anything else as sent (the create path says why not)."""
    if isinstance(value, str):
        try:
            return float(value.replace(",", ""))
        except ValueError:
            return value
    return value


def lead(payload: Any, settings: Mapping[str, Any]) -> Mapped:
    """A JSON body as a lead, by the connector's map."""
    found = {target: resolve(payload, pointer) for target, pointer in (settings.get("map") or {}).items()}
    fields = contact({target: found.get(target) for target in CONTACT_TARGETS})
    if found.get("estimated_value") is not None:
        fields["estimated_value"] = estimated_value(found["estimated_value"])
    custom = {target.removeprefix(CUSTOM_PREFIX): value for target, raw in found.items()
              if target.startswith(CUSTOM_PREFIX) and (value := raw if isinstance(raw, (int, float, bool))
                                                        else text(raw)) is not None}
    if custom:
        fields["custom_fields"] = custom
    sent = {target.removeprefix(ATTRIBUTION_PREFIX): text(value, 200) for target, value in found.items()
            if target.startswith(ATTRIBUTION_PREFIX)}
    pointer = settings.get("external_id")
    return Mapped(external_id(resolve(payload, pointer)) if pointer is not None else None, fields,
                  {key: value for key, value in sent.items() if value is not None})
