"""Google Ads lead form webhooks: Google posts each lead as JSON, with the key the advertiser
gave it (`google_key`) inside the body, and a test lead marked `is_test`."""

from __future__ import annotations

from typing import Any, Mapping

from .mapping import Mapped, attribution, external_id, form_answers, same_key

# Google's column ids of the contact; other columns go to the custom fields the connector maps.
CONTACT_COLUMNS = {"FULL_NAME": "full_name", "FIRST_NAME": "first_name", "LAST_NAME": "last_name",
                   "PHONE_NUMBER": "phone", "EMAIL": "email"}


def verified(payload: Any, key: str) -> bool:
    """Whether the body carries the connector's key as google_key (compared in constant time)."""
    sent = payload.get("google_key") if isinstance(payload, dict) else None
    return isinstance(sent, str) and same_key(sent, key)


def without_key(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The body as it is kept: all of it but the connector's key, which is never stored."""
    return {name: value for name, value in payload.items() if name != "google_key"}


def columns(payload: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(column_id, string_value) of each answer."""
    rows = payload.get("user_column_data")
    return [(row["column_id"], row.get("string_value")) for row in rows if isinstance(row, dict)
            and isinstance(row.get("column_id"), str)] if isinstance(rows, list) else []


def lead(payload: Mapping[str, Any], settings: Mapping[str, Any]) -> Mapped:
    """A Google lead form webhook body as a lead."""
    return Mapped(external_id(payload.get("lead_id")), form_answers(columns(payload), CONTACT_COLUMNS, settings),
                  attribution(campaign_id=payload.get("campaign_id"), adgroup_id=payload.get("adgroup_id"),
                              ad_id=payload.get("creative_id"), form_id=payload.get("form_id"),
                              gclid=payload.get("gcl_id")),
                  test=payload.get("is_test") is True)
