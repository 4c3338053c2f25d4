"""Score: the sum of its reasons, clamped to 0..100, won 100, lost 0, banded by config."""

from decimal import Decimal

import pytest

from leadsvc.config import DEFAULTS
from leadsvc.documents import LeadSchema
from leadsvc.scoring import ENGAGEMENT_CAP, band, band_ranges, score_lead

BASE = dict(phone=None, email=None, first_name="", last_name="", estimated_value=None, custom_fields={},
            source=None, field_scores={}, engagement=0, status_kind="open")


def score(**changes):
    return score_lead(**{**BASE, **changes})


def test_the_score_is_the_sum_of_its_reasons():
    total, reasons = score(phone="+919876543210", email="a@b.c", first_name="A", last_name="B",
                           estimated_value=Decimal("5000000"), source=("Referral", 20),
                           custom_fields={"product_interest": "villa", "budget_confirmed": True},
                           field_scores={"product_interest": {"villa": 15}, "budget_confirmed": {"true": 10}},
                           engagement=8)
    assert total == sum(r["points"] for r in reasons) == 20 + 10 + 5 + 5 + 15 + 15 + 10 + 8
    assert {"reason": "custom_field:budget_confirmed=true", "points": 10} in reasons


@pytest.mark.parametrize("value,points", [(None, 0), (0, 0), (1, 5), (999_999, 5), (1_000_000, 10),
                                          (5_000_000, 15), (10_000_000, 20), (10**12, 20)])
def test_estimated_value_tiers(value, points):
    total, _ = score(estimated_value=value)
    assert total == points


def test_engagement_is_capped():
    assert score(engagement=1000)[0] == ENGAGEMENT_CAP


def test_scores_are_clamped_to_0_100():
    assert score(source=("Spam", -50))[0] == 0
    assert score(source=("Gold", 100), phone="+91", engagement=25)[0] == 100


def test_won_is_100_and_lost_is_0_whatever_else():
    assert score(status_kind="won")[0] == 100
    assert score(status_kind="lost", source=("Referral", 20), phone="x")[0] == 0


def test_bands_follow_the_configured_thresholds():
    settings = {"scoring": {"hot": 70, "warm": 40}}
    assert [band(s, settings) for s in (100, 70, 69, 40, 39, 0)] == ["hot", "hot", "warm", "warm", "cold", "cold"]
    assert band_ranges(["hot", "cold"], settings) == [(70, 100), (0, 39)]
    assert DEFAULTS["scoring"] == {"hot": 70, "warm": 40}


def test_other_thresholds_change_bands_in_responses_and_filters(make_app, ws, make_lead):
    client = make_app(scoring={"hot": 30, "warm": 20}).test_client()
    lead = make_lead(ws, via=client)   # Website 10 + phone 10 + name 5 = 25
    assert lead["score"] == 25 and lead["score_band"] == "warm"
    listed = client.get("/api/v1/leads?filter[score_band]=warm", headers=ws.headers()).json["data"]
    assert [item["id"] for item in listed] == [lead["id"]]


def test_the_documented_lead_schema_matches_what_the_api_returns(client, make_lead, ws):
    lead = make_lead(ws, email="s@example.com", custom_fields={"family_size": 2})
    assert LeadSchema().validate(lead) == {}
    assert set(LeadSchema().fields) - {"activities", "notes", "tasks"} == set(lead)
