"""Lead score: 0..100 and the reasons that add up to it.

Nothing here reads the clock, so a stored score never goes stale; it is recomputed whenever the
lead, its status or its logged activities change.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Iterable, Mapping

from .config import Settings

# (at least this estimated value, points), highest first; in the workspace's currency.
VALUE_TIERS: tuple[tuple[int, int], ...] = ((10_000_000, 20), (5_000_000, 15), (1_000_000, 10), (1, 5))
CONTACT_POINTS = {"phone": 10, "email": 5, "name": 5}
# Points per logged activity, and the most engagement can add.
ENGAGEMENT_POINTS = {"call": 5, "meeting": 10, "visit": 10, "email": 3, "whatsapp": 3, "sms": 2}
ENGAGEMENT_CAP = 25


def score_lead(*, phone: str | None, email: str | None, first_name: str, last_name: str,
               estimated_value: Decimal | float | None, custom_fields: Mapping[str, object],
               source: tuple[str, int] | None, field_scores: Mapping[str, Mapping[str, int]],
               engagement: int, status_kind: str) -> tuple[int, list[dict]]:
    """The score and its reasons; source is (name, weight), field_scores is {field: {value: points}}."""
    if status_kind == "won":
        return 100, [{"reason": "status:won", "points": 100}]
    if status_kind == "lost":
        return 0, [{"reason": "status:lost", "points": 0}]
    reasons: list[dict] = []
    if source is not None and source[1]:
        reasons.append({"reason": f"source:{source[0]}", "points": source[1]})
    if phone:
        reasons.append({"reason": "contact:phone", "points": CONTACT_POINTS["phone"]})
    if email:
        reasons.append({"reason": "contact:email", "points": CONTACT_POINTS["email"]})
    if first_name and last_name:
        reasons.append({"reason": "contact:name", "points": CONTACT_POINTS["name"]})
    if estimated_value is not None:
        for threshold, points in VALUE_TIERS:
            if estimated_value >= threshold:
                reasons.append({"reason": f"value:>={threshold}", "points": points})
                break
    for name, value in custom_fields.items():
        points = field_scores.get(name, {}).get(_score_key(value))
        if points:
            reasons.append({"reason": f"custom_field:{name}={_score_key(value)}", "points": points})
    if engagement:
        reasons.append({"reason": "engagement", "points": min(engagement, ENGAGEMENT_CAP)})
    total = sum(r["points"] for r in reasons)
    return max(0, min(100, total)), reasons


def _score_key(value: object) -> str:
    """Custom-field values as the setup file's score keys spell them (booleans as true/false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def band(score: int, settings: Settings) -> str:
    thresholds = settings["scoring"]
    return "hot" if score >= thresholds["hot"] else "warm" if score >= thresholds["warm"] else "cold"


def band_ranges(bands: Iterable[str], settings: Settings) -> list[tuple[int, int]]:
    """Inclusive score ranges of the bands, for filtering on the indexed score."""
    hot, warm = settings["scoring"]["hot"], settings["scoring"]["warm"]
    ranges = {"hot": (hot, 100), "warm": (warm, hot - 1), "cold": (0, warm - 1)}
    return [ranges[b] for b in bands]
